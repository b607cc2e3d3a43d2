"""The toy model's "Table 1": every decoder on the same prompts in one run, with its audit.

    python scripts/toy_table.py [--n-audit 1000] [hydra overrides, e.g. prompts.n=32]

1. runs `experiment=toy_decoders` (AR baseline + every decoder, interleaved, same prompts) and
   `experiment=toy_sjd2` (SJD2 on its noise-aware fine-tune, with AR and SJD on that model):
   steps, step compression, latency speedup vs AR of the same model;
   FID (toy feature network, held-out real toy images) and CLIP score (toy CLIP) per decoder;
2. audits each decoder against AR of its model: n-audit samples each for one caption,
   per-position two-sample chi-square (Bonferroni) and mean per-position TV distance, with AR
   against AR (two halves) as the noise floor;
3. writes results/toy_table1.csv and results/toy_table1.md, and results/toy_quality_vs_speedup.png
   (FID and CLIP against latency speedup, one point per decoder).
"""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir

from sjd.audit.runs import run_and_audit
from sjd.harness.config import register_resolvers
from sjd.harness.plots import quality_vs_speedup
from sjd.harness.results import markdown_table

ROOT = Path(__file__).resolve().parents[1]

EXPERIMENTS = ("toy_decoders", "toy_sjd2")
SETTINGS = ("window", "init", "context", "denoise_steps")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-audit", type=int, default=1000)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    register_resolvers()
    rows, run_dirs = [], []
    for experiment in EXPERIMENTS:
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose("config", overrides=[f"experiment={experiment}", *args.overrides])
        run_dir = ROOT / "outputs" / "runs" / f"{datetime.now():%Y-%m-%d_%H-%M-%S}_toy_table1_{experiment}"
        rows += run_and_audit(cfg, run_dir, args.n_audit, SETTINGS)
        run_dirs.append(str(run_dir.relative_to(ROOT)))
    table = pd.DataFrame(rows)
    out = ROOT / "results" / "toy_table1"
    table.drop(columns=["prompts"]).to_csv(out.with_suffix(".csv"), index=False)
    out.with_suffix(".md").write_text(
        f"Toy models, {rows[0]['prompts']} toy prompts, seed {cfg.seed}, CPU. Speedups are against AR on the same "
        f"model in the same run; audit: {args.n_audit} samples per decoder of one caption against AR of its model "
        "(per-position chi-square, Bonferroni).\n"
        f"`python scripts/toy_table.py`, run dirs {', '.join(f'`{d}`' for d in run_dirs)}\n\n"
        + markdown_table(table.drop(columns=["prompts"]))
        + "\n"
    )
    quality_vs_speedup(table, ROOT / "results" / "toy_quality_vs_speedup.png")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
