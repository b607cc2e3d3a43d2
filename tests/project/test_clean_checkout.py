"""A user's runs leave their checkout clean: the results row of a default run goes to the untracked
outputs/, so the next run's provenance records a clean git hash, not `-dirty`."""

import json

import pandas as pd
import pytest
from checkout_copy import checkout_copy, git, python_in

TINY = ["prompts.n=2", "decoder.window=4", "warmup=0"]


@pytest.mark.slow
def test_two_default_runs_leave_the_checkout_clean_and_record_a_clean_hash(tmp_path):
    checkout = checkout_copy(tmp_path / "checkout")
    head = git(checkout, "rev-parse", "HEAD").strip()
    run_dirs = []
    for i in range(2):
        run_dir = checkout / "outputs" / "runs" / f"run{i}"
        proc = python_in(checkout, "run.py", *TINY, f"hydra.run.dir={run_dir}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert git(checkout, "status", "--porcelain") == "", f"run {i} changed the checkout"
        run_dirs.append(run_dir)

    second = json.loads((run_dirs[1] / "meta.json").read_text())
    assert second["git_hash"] == head  # no -dirty
    rows = pd.read_csv(checkout / "outputs" / "runs.csv")  # the default results_csv, one row per decoder and run
    assert list(rows["run_dir"]) == [str(d) for d in run_dirs for _ in ("ar", "sjd")]
    assert set(rows["git_hash"]) == {head}
    assert not (checkout / "results" / "runs.csv").exists()
