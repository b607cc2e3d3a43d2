"""Collect every run summary of a sweep into one table.

    python scripts/collect_sweep.py outputs/multirun/<date>_<id> [--out sweep.csv]

Reads `<job dir>/summary.csv` of each finished job under the sweep directory (Hydra's
multirun layout, any launcher), adds the job's directory name, and prints and writes one CSV.
Jobs without a summary (still running, or failed) are listed, not silently dropped.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from sjd.harness.results import markdown_table

SHOWN = ["job", "model", "decoder", "n_forward", "step_compression", "latency_speedup", "fid", "clip"]


def collect(sweep_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    tables, missing = [], []
    for job in sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        summary = job / "summary.csv"
        if summary.is_file():
            tables.append(pd.read_csv(summary).assign(job=job.name))
        else:
            missing.append(job.name)
    return (pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()), missing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--out", type=Path, default=None, help="default: <sweep_dir>/sweep.csv")
    args = ap.parse_args()
    table, missing = collect(args.sweep_dir)
    if table.empty:
        raise SystemExit(f"{args.sweep_dir}: no job has a summary.csv yet (jobs: {missing})")
    out = args.out or args.sweep_dir / "sweep.csv"
    table.to_csv(out, index=False)
    print(markdown_table(table[[c for c in SHOWN if c in table.columns]]))
    print(f"{len(table)} rows from {table['job'].nunique()} jobs -> {out}")
    if missing:
        print(f"no summary (running or failed): {', '.join(missing)}")


if __name__ == "__main__":
    main()
