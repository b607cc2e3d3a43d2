"""Withdraw the latency intervals that rows written before per-batch timing carry in a results CSV.

    python scripts/withdraw_stale_intervals.py results/studies/*.csv

Before runs timed each batch on its own, a batched run (batch_size > 1) recorded one latency for the whole run
and bootstrapped its prompts over it: its latency_speedup and efficiency intervals are not over timed batches
(zero width where the run was one batch, which reads as certainty and is none; elsewhere a spread of step
counts, not of timings), and the pages already show none of them. Such rows (no `latency_units`,
batch_size > 1, not the reference decoder) get both intervals blanked and `latency_interval` saying why;
the point values stay. Rows with `latency_units` are left as they are, and a file with nothing to withdraw is
not rewritten. tests/project/test_results_csvs.py holds every
committed CSV to it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

TIMED = ("latency_speedup", "efficiency")
WITHDRAWN = "withdrawn: one latency for a batched run (before per-batch timing); rerun for an interval"


def stale_rows(rows: pd.DataFrame) -> pd.Series:
    """Rows whose latency intervals came from a batched run timed as one: no latency_units, batch_size > 1, a
    decoder other than the run's reference (whose ratio to itself is 1 exactly)."""
    if "batch_size" not in rows or f"{TIMED[0]}_lo" not in rows:
        return pd.Series(False, index=rows.index)
    units = rows["latency_units"] if "latency_units" in rows else pd.Series(float("nan"), index=rows.index)
    reference = rows["decoder"] == rows["baseline"] if "baseline" in rows else pd.Series(False, index=rows.index)
    return units.isna() & (rows["batch_size"] > 1) & ~reference


def withdraw(rows: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    bounds = [f"{c}_{end}" for c in TIMED for end in ("lo", "hi") if f"{c}_{end}" in rows]
    stale = stale_rows(rows) & rows[bounds].notna().any(axis=1)
    if not stale.any():
        return rows, 0
    rows = rows.copy()
    rows.loc[stale, bounds] = float("nan")
    if "latency_interval" not in rows:
        rows["latency_interval"] = pd.Series(pd.NA, index=rows.index, dtype="object")
    rows.loc[stale, "latency_interval"] = WITHDRAWN
    return rows, int(stale.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csvs", nargs="+", type=Path)
    for path in ap.parse_args().csvs:
        rows, n = withdraw(pd.read_csv(path, low_memory=False))
        if n:
            rows.to_csv(path, index=False)
        print(f"{path}: {n} row(s) withdrawn")


if __name__ == "__main__":
    main()
