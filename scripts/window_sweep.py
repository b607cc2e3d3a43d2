"""SJD's step compression and latency speedup against the window length, from one run.

    python scripts/window_sweep.py [hydra overrides, e.g. prompts.n=32]

Runs `experiment=toy_window_sweep` (AR and SJD at windows 1..64, interleaved on the same
prompts), then writes results/toy_window_sweep.csv, .md and .png.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

from hydra import compose, initialize_config_dir

from sjd.harness.config import register_resolvers
from sjd.harness.plots import window_sweep
from sjd.harness.results import markdown_table
from sjd.harness.runner import run

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=["experiment=toy_window_sweep", *sys.argv[1:]])
    run_dir = ROOT / "outputs" / "runs" / f"{datetime.now():%Y-%m-%d_%H-%M-%S}_window_sweep"
    summary = run(cfg, run_dir)
    configs = json.loads(summary["decoder_configs"].iloc[0])
    sweep = summary[summary["decoder"] != "ar"].copy()
    sweep["window"] = [configs[d]["window"] for d in sweep["decoder"]]
    table = sweep[
        [
            "window",
            "decoder",
            "n_forward",
            "step_compression",
            "latency_s",
            "latency_speedup",
            "outside_model_frac",
            "mean_accepted",
        ]
    ].sort_values("window")
    out = ROOT / "results" / "toy_window_sweep"
    table.to_csv(out.with_suffix(".csv"), index=False)
    out.with_suffix(".md").write_text(
        f"SJD window sweep on the toy model ({summary['prompt_selection'].iloc[0]} toy prompts, seed {cfg.seed}), "
        f"`python scripts/window_sweep.py`, run dir `{run_dir.relative_to(ROOT)}`\n\n" + markdown_table(table) + "\n"
    )
    window_sweep(table, out.with_suffix(".png"))
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
