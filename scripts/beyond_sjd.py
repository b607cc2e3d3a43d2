"""Beyond SJD on the toy model: coupled drafting, our combination and its ablation, the lossy
comparators, and the Pareto picture, from one invocation.

    python scripts/beyond_sjd.py [--n-audit 200] [hydra overrides, e.g. prompts.n=32]

1. `experiment=toy_coupled` at windows 16 and 64 (SJD, SCD Gumbel/maximal, our `csjd` and its
   ablations) and `experiment=toy_lossy` (GSD, LANTERN-style, ZipAR), each with AR in the same
   run; every decoder audited against AR (sjd.audit.runs).
2. The cost of a window forward relative to a one-token forward of the toy model, measured
   here (median of repeated forwards against a mid-image context): c_W. A decoder taking S
   forwards at window W can at best be (step compression / c_W) faster than AR, so
   `efficiency` = latency speedup / (step compression / c_W) shows what decoder bookkeeping costs.
   `forward_cost` and `efficiency_run` are the same measured inside the decode itself (each run's
   summary, sjd.harness.results.forward_efficiency): model time per forward against AR's, on the contexts
   actually decoded and interleaved with AR, so they move less between invocations than c_W.
3. results/toy_beyond_sjd.{csv,md} and results/toy_pareto.png (speedup vs audit TV and vs FID).
   For each window it prints the best audited lossless decoder's step compression as a multiple
   of SJD's at the same window, and that decoder's efficiency; nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import datetime
from pathlib import Path

import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from sjd.audit.runs import run_and_audit
from sjd.harness.config import register_resolvers
from sjd.harness.plots import pareto
from sjd.harness.results import markdown_table
from sjd.types import Prompt

ROOT = Path(__file__).resolve().parents[1]

RUNS = (("toy_coupled", 16), ("toy_coupled", 64), ("toy_lossy", 16))


def window_cost(cfg, windows: tuple[int, ...], repeats: int = 40) -> dict[int, float]:
    """Median time of a W-token forward / median time of a 1-token forward, same context."""
    adapter = instantiate(cfg.model.adapter, device="cpu")
    adapter.prefill([Prompt("w", cfg.model.audit_prompt)], True)
    context = adapter.layout.n_tokens // 2
    tokens = adapter.layout.free_token_ids[:1].repeat(1, context + max(windows))
    adapter.forward(tokens[:, :context], [0])
    medians = {}
    for w in (1, *windows):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            adapter.forward(tokens[:, context : context + w], [context])
            times.append(time.perf_counter() - t0)
        medians[w] = statistics.median(times)
    return {w: medians[w] / medians[1] for w in windows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-audit", type=int, default=200)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    register_resolvers()
    torch.manual_seed(0)
    rows, run_dirs, costs = [], [], {}
    for experiment, window in RUNS:
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose("config", overrides=[f"experiment={experiment}", f"decoder.window={window}", *args.overrides])
        if not costs:
            costs = window_cost(cfg, tuple(sorted({w for _, w in RUNS})))
        stamp = f"{datetime.now():%Y-%m-%d_%H-%M-%S}"
        run_dir = ROOT / "outputs" / "runs" / f"{stamp}_beyond_sjd_{experiment}_w{window}"
        for row in run_and_audit(cfg, run_dir, args.n_audit):
            row.update(experiment=experiment, window=window, window_cost=costs[window])
            rows.append(row)
        run_dirs.append(str(run_dir.relative_to(ROOT)))
    table = pd.DataFrame(rows)
    table = table[table.decoder != "ar"].reset_index(drop=True)
    sjd_compression = table[table.decoder == "sjd"].groupby("window")["step_compression"].first()
    table["vs_sjd_steps"] = table.step_compression / table.window.map(sjd_compression)
    table["allowed_speedup"] = table.step_compression / table.window_cost
    table["efficiency"] = table.latency_speedup / table.allowed_speedup
    columns = ["window", "decoder", "settings", "lossless_expected", "steps", "step_compression", "vs_sjd_steps"]
    columns += ["latency_speedup", "window_cost", "efficiency", "forward_cost", "efficiency_run"]
    columns += ["fid", "clip", "audit_tv", "audit_p", "ar_noise_tv"]
    out = ROOT / "results" / "toy_beyond_sjd"
    table[columns].to_csv(out.with_suffix(".csv"), index=False)
    out.with_suffix(".md").write_text(
        f"Toy model, {rows[0]['prompts']} toy prompts, seed {cfg.seed}, CPU. Speedups against AR in the same run; "
        f"vs_sjd_steps = step compression / SJD's at the same window; window_cost = time of a W-token forward / a "
        f"1-token forward (isolated forwards, measured in this invocation); efficiency = latency speedup / (step "
        f"compression / window_cost); forward_cost and efficiency_run: the same from the decode itself (model time per "
        f"forward against AR's in the same run, sjd.harness.results.forward_efficiency). "
        f"Audit: {args.n_audit} samples of one caption per decoder against AR (per-position chi-square, Bonferroni).\n"
        f"`python scripts/beyond_sjd.py --n-audit {args.n_audit}`, run dirs {', '.join(f'`{d}`' for d in run_dirs)}\n\n"
        + markdown_table(table[columns])
        + "\n"
    )
    pareto(table[table.window == 16], ROOT / "results" / "toy_pareto.png")
    print(table[columns].to_string(index=False))
    for window, group in table.groupby("window"):
        lossless = group[group.lossless_expected & (group.audit_p > 1e-3)]
        best = lossless.loc[lossless.step_compression.idxmax()]
        print(
            f"window {window}: best audited lossless decoder {best.decoder}: {best.vs_sjd_steps:.2f}x SJD's step "
            f"compression, efficiency {best.efficiency_run:.2f} in the run, {best.efficiency:.2f} with "
            f"isolated window costs"
        )


if __name__ == "__main__":
    main()
