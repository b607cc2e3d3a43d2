"""Render every published table next to our measured rows: `python scripts/paper_tables.py`.

Reads results/paper/published.csv and the runs table (--runs, default outputs/runs.csv: where
run.py appends every run's rows, `results_csv`), writes
results/paper/<table>.{csv,md} and prints which tables have measured rows. A table's rows are
measured by `python run.py experiment=<table>` (see experiments/README.md), which needs the
model's weights; tables without a run show "not run".
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from sjd.harness.results import markdown_table
from studies.paper import compare, load_published

ROOT = Path(__file__).resolve().parents[1]

SHOWN = ["method", "published_steps", "measured_steps", "published_step_compression", "measured_step_compression",
         "ratio_step_compression", "published_latency_speedup", "measured_latency_speedup", "ratio_latency_speedup",
         "published_fid", "measured_fid", "published_clip", "measured_clip", "evidence"]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--published", type=Path, default=ROOT / "results" / "paper" / "published.csv")
    ap.add_argument("--runs", type=Path, default=ROOT / "outputs" / "runs.csv", help="rows appended by run.py")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "paper")
    args = ap.parse_args()
    published = load_published(args.published)
    runs = pd.read_csv(args.runs) if args.runs.is_file() else pd.DataFrame()
    args.out.mkdir(parents=True, exist_ok=True)
    for table in published["table"].unique():
        rows = compare(published, runs, table)
        rows.to_csv(args.out / f"{table}.csv", index=False)
        meta = published[published["table"] == table].iloc[0]
        header = (
            f"# {table}: {meta['model']} on {meta['dataset']}\n\n"
            f"Published rows from {meta['source']} ({meta['evidence']}); measured rows from "
            f"`python run.py experiment={table}`, rendered by `python scripts/paper_tables.py`.\n\n"
        )
        (args.out / f"{table}.md").write_text(header + markdown_table(rows[SHOWN], floatfmt=".2f") + "\n")
        measured = int((rows["measured_run"] != "not run").sum())
        print(f"{table}: {len(rows)} published rows, {measured} measured")


if __name__ == "__main__":
    main()
