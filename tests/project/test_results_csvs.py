"""Every committed results CSV holds only latency intervals that are real: none from a batched run timed as one
(before per-batch timing) and no zero-width one beside a decoder other than the reference; and
scripts/withdraw_stale_intervals.py, which blanks the stale ones, withdraws exactly those."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
CSVS = sorted((ROOT / "results").rglob("*.csv"))
TIMED = ("latency_speedup", "efficiency")


def reference(rows: pd.DataFrame) -> pd.Series:
    return rows["decoder"] == rows["baseline"] if "baseline" in rows else pd.Series(False, index=rows.index)


@pytest.mark.parametrize("path", CSVS, ids=[str(p.relative_to(ROOT)) for p in CSVS])
def test_no_latency_interval_that_is_not_over_timed_batches(path):
    rows = pd.read_csv(path, low_memory=False)
    for column in TIMED:
        lo, hi = f"{column}_lo", f"{column}_hi"
        if lo not in rows:
            continue
        shown = rows[lo].notna() & ~reference(rows)
        zero = shown & (rows[lo] == rows[hi])
        assert not zero.any(), f"{path}: {int(zero.sum())} zero-width {column} interval(s), e.g. row {zero.idxmax()}"
        if "batch_size" in rows:
            units = rows["latency_units"] if "latency_units" in rows else pd.Series(float("nan"), index=rows.index)
            stale = shown & units.isna() & (rows["batch_size"] > 1)
            assert not stale.any(), (f"{path}: {int(stale.sum())} {column} interval(s) of batched runs timed as one; "
                                     "python scripts/withdraw_stale_intervals.py withdraws them")  # fmt: skip


def test_the_tool_withdraws_exactly_the_batched_rows_timed_as_one(tmp_path):
    rows = pd.DataFrame({
        "decoder": ["ar", "sjd", "sjd", "sjd"], "baseline": "ar", "batch_size": [8, 8, 1, 8],
        "latency_units": [None, None, None, 4.0], "latency_speedup": [1.0, 1.2, 1.3, 1.4],
        "latency_speedup_lo": [1.0, 1.2, 1.1, 1.2], "latency_speedup_hi": [1.0, 1.2, 1.5, 1.6],
        "efficiency": [1.0, 0.9, 0.8, 0.7], "efficiency_lo": [1.0, 0.9, 0.7, 0.6],
        "efficiency_hi": [1.0, 0.9, 0.9, 0.8],
    })  # fmt: skip
    path = tmp_path / "study.csv"
    rows.to_csv(path, index=False)
    proc = subprocess.run([sys.executable, "scripts/withdraw_stale_intervals.py", str(path)], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0 and "1 row(s) withdrawn" in proc.stdout, proc.stdout + proc.stderr
    after = pd.read_csv(path)
    assert after.loc[1, ["latency_speedup_lo", "latency_speedup_hi", "efficiency_lo", "efficiency_hi"]].isna().all()
    assert after.loc[1, "latency_speedup"] == 1.2 and after.loc[1, "latency_interval"].startswith("withdrawn")
    untouched = [0, 2, 3]  # the reference, a prompt timed alone, a run timed per batch
    assert after.loc[untouched, "latency_speedup_lo"].tolist() == [1.0, 1.1, 1.2]
    assert after.loc[untouched, "latency_interval"].isna().all()
