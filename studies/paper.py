"""Our measured rows next to the published ones (results/paper/published.csv).

A published table is matched to our runs by name: a run made with `experiment=<table>` records
`experiment=<table>` in its results row (`results_csv`, default outputs/runs.csv), and its
decoders are named as the published methods (`ar`, `sjd`, `pjd_c16`, ...). The latest run of
each experiment is used. Ratios are ours over theirs for step compression and latency speedup
(1.0 = reproduced); FID and CLIP are given as differences, and only when both sides used the
same evaluation protocol.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

PUBLISHED_COLUMNS = [
    "table", "model", "dataset", "method", "window", "steps", "step_compression", "latency_s",
    "latency_speedup", "fid", "clip", "gpu", "protocol", "source", "evidence",
]  # fmt: skip
COMPARED = ["steps", "step_compression", "latency_s", "latency_speedup", "fid", "clip"]


def load_published(path: Path) -> pd.DataFrame:
    table = pd.read_csv(path)
    missing = [c for c in PUBLISHED_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    unsourced = table[table["source"].isna() | table["evidence"].isna()]
    if len(unsourced):
        raise ValueError(f"{path}: rows {list(unsourced.index + 2)} (file lines) have no source or evidence")
    return table


def latest_measured(runs: pd.DataFrame, table: str) -> pd.DataFrame:
    """Rows of the latest run whose experiment is `table`, one per decoder."""
    if "experiment" not in runs.columns:
        return runs.iloc[0:0]
    rows = runs[runs["experiment"] == table]
    if rows.empty:
        return rows
    latest = rows["run_dir"].iloc[-1]
    rows = rows[rows["run_dir"] == latest].rename(columns={"n_forward": "steps"})
    for metric in ("fid", "clip"):
        if metric not in rows.columns:
            rows = rows.assign(**{metric: np.nan})
    if "fid_protocol" not in rows.columns:
        rows = rows.assign(fid_protocol=None)
    return rows.set_index("decoder")


def compare(published: pd.DataFrame, runs: pd.DataFrame, table: str) -> pd.DataFrame:
    """One row per published method of `table`: published values, ours, and ratios."""
    theirs = published[published["table"] == table].set_index("method")
    ours = latest_measured(runs, table)
    out = []
    for method, pub in theirs.iterrows():
        row = {"method": method, "source": pub["source"], "evidence": pub["evidence"]}
        mine = ours.loc[method] if method in ours.index else None
        row["measured_run"] = mine["run_dir"] if mine is not None else "not run"
        for key in COMPARED:
            row[f"published_{key}"] = pub[key]
            row[f"measured_{key}"] = mine[key] if mine is not None else np.nan
        for key in ("step_compression", "latency_speedup"):
            row[f"ratio_{key}"] = row[f"measured_{key}"] / pub[key] if pub[key] else np.nan
        same_protocol = mine is not None and mine["fid_protocol"] == pub["protocol"]
        for key in ("fid", "clip"):
            row[f"delta_{key}"] = row[f"measured_{key}"] - pub[key] if same_protocol else np.nan
        out.append(row)
    return pd.DataFrame(out)
