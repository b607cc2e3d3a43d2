"""Published tables next to ours: the published CSV is complete and sourced, and the renderer
matches measured rows to published methods and computes ratios from them."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from studies.paper import compare, load_published

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "results" / "paper" / "published.csv"


def test_published_rows_are_sourced_and_every_table_has_an_ar_row():
    table = load_published(PUBLISHED)
    assert set(table["evidence"]) <= {"secondary note", "repository figure", "repository README", "paper"}
    for name, rows in table.groupby("table"):
        assert "ar" in set(rows["method"]), name
        ar = rows.set_index("method").loc["ar"]
        assert ar["step_compression"] == 1.0 and ar["latency_speedup"] == 1.0


def test_unsourced_rows_are_refused_with_their_line(tmp_path):
    bad = tmp_path / "p.csv"
    rows = pd.read_csv(PUBLISHED)
    rows.loc[3, "source"] = None
    rows.to_csv(bad, index=False)
    with pytest.raises(ValueError, match=r"rows \[5\]"):
        load_published(bad)


def test_measured_rows_are_matched_by_experiment_and_method():
    published = load_published(PUBLISHED)
    runs = pd.DataFrame(
        [
            {"experiment": "pjd_lumina_coco5k", "decoder": d, "n_forward": f, "step_compression": sc,
             "latency_s": 1.0, "latency_speedup": ls, "run_dir": "outputs/runs/old"}
            for d, f, sc, ls in [("ar", 2357, 1.0, 1.0), ("pjd_c16", 600, 3.0, 2.0)]
        ]
        + [
            {"experiment": "pjd_lumina_coco5k", "decoder": d, "n_forward": f, "step_compression": sc,
             "latency_s": 1.0, "latency_speedup": ls, "run_dir": "outputs/runs/new"}
            for d, f, sc, ls in [("ar", 2357, 1.0, 1.0), ("pjd_c16", 476, 4.95, 5.0)]
        ]
    )  # fmt: skip
    rows = compare(published, runs, "pjd_lumina_coco5k").set_index("method")
    assert rows.loc["pjd_c16", "measured_run"] == "outputs/runs/new"  # the latest run
    assert rows.loc["pjd_c16", "ratio_step_compression"] == pytest.approx(1.0)
    assert rows.loc["pjd_c16", "ratio_latency_speedup"] == pytest.approx(5.0 / 5.99)
    assert rows.loc["pjd_c11", "measured_run"] == "not run"
    assert pd.isna(rows.loc["pjd_c16", "delta_fid"])  # no FID measured under the same protocol


def test_renderer_writes_one_table_per_published_table(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "paper_tables.py"), "--runs", str(tmp_path / "none.csv"),
         "--out", str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    tables = set(pd.read_csv(PUBLISHED)["table"])
    assert {p.stem for p in tmp_path.glob("*.md")} == tables
    assert "not run" in (tmp_path / "sjd_lumina_coco5k.csv").read_text()
