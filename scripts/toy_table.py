"""The toy model's "Table 1": every decoder on the same prompts in one run, with its audit.

    python scripts/toy_table.py [--n-audit 1000] [hydra overrides, e.g. prompts.n=32]

1. runs `experiment=toy_decoders` (AR baseline + every decoder, interleaved, same prompts):
   steps, step compression, latency speedup vs AR;
2. audits each decoder against AR on the toy model: n-audit samples each for one caption,
   per-position two-sample chi-square (Bonferroni) and mean per-position TV distance, with AR
   against AR (two halves) as the noise floor;
3. writes results/toy_table1.csv and results/toy_table1.md.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sjd.audit import draw_samples, marginal_test  # noqa: E402
from sjd.config import register_resolvers  # noqa: E402
from sjd.decoders.ar import ARDecoder  # noqa: E402
from sjd.results import markdown_table  # noqa: E402
from sjd.runner import build_decoders, run  # noqa: E402
from sjd.sampling import SamplingConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-audit", type=int, default=1000)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    register_resolvers()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=["experiment=toy_decoders", *args.overrides])
    run_dir = ROOT / "outputs" / "runs" / f"{datetime.now():%Y-%m-%d_%H-%M-%S}_toy_table1"
    summary = run(cfg, run_dir).set_index("decoder")

    sampling = SamplingConfig(**OmegaConf.to_container(cfg.model.sampling))
    adapter = instantiate(cfg.model.adapter, device="cpu")
    caption, n, batch = cfg.model.audit_prompt, args.n_audit, 500
    reference = draw_samples(ARDecoder(), adapter, sampling, caption, 2 * n, batch, cfg.seed, "r").numpy()
    noise = marginal_test(reference[:n], reference[n:])
    rows = []
    decoders, _ = build_decoders(cfg)
    for d in decoders:
        audit = marginal_test(
            draw_samples(d, adapter, sampling, caption, n, batch, cfg.seed, "d").numpy(), reference[:n]
        )
        s = summary.loc[d.name]
        settings = ", ".join(f"{k}={v}" for k, v in d.config().items() if k in ("window", "init"))
        rows.append(
            {
                "decoder": d.name,
                "settings": settings or "-",
                "steps": s["n_forward"],
                "step_compression": s["step_compression"],
                "latency_s": s["latency_s"],
                "latency_speedup": s["latency_speedup"],
                "audit_tv": audit.tv_distance,
                "audit_p": audit.p_value,
                "ar_noise_tv": noise.tv_distance,
                "lossless_expected": d.lossless,
            }
        )
    table = pd.DataFrame(rows)
    out = ROOT / "results" / "toy_table1"
    table.to_csv(out.with_suffix(".csv"), index=False)
    out.with_suffix(".md").write_text(
        f"Toy model, {summary['prompt_selection'].iloc[0]} toy prompts, seed {cfg.seed}, CPU; audit: {n} samples "
        f"per decoder of one caption vs AR (per-position chi-square, Bonferroni).\n"
        f"`python scripts/toy_table.py`, run dir `{run_dir.relative_to(ROOT)}`\n\n" + markdown_table(table) + "\n"
    )
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
