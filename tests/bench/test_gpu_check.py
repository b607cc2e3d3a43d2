"""The device check (scripts/gpu_check.py over sjd/bench/gpu_check.py) as a user runs it before a GPU comes:
`--tiny --device cpu` runs every stage on tiny configs and prints one JSON line a stage; the compiled engine's
invariants hold there as a GPU must show them (no graph break, no recompile after the warm-up, no input written in
place without a static address, the static cache never reallocated or moved, compiled tokens equal to eager ones,
no host sync an AR step and one an SJD iteration). One run of the command serves every assertion; the page it
feeds is rendered from its lines."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sjd.bench.gpu_check import Check, main, run_stage
from studies.gpu_check_page import render

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_check(tmp_path_factory) -> tuple[list[dict], Path]:
    out = tmp_path_factory.mktemp("gpu")
    command = [sys.executable, "scripts/gpu_check.py", "--tiny", "--device", "cpu", "--deadline-s", "3000",
               "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return printed, out


@pytest.mark.slow
def test_the_tiny_check_runs_every_stage_and_prints_one_json_line_each(tiny_check):
    printed, out = tiny_check
    assert [line["stage"] for line in printed] == ["start", "device", "attention", "engine", "run", "decoders"]
    failed = {line["stage"]: line.get("error") for line in printed if line["status"] != "ok"}
    assert not failed, failed
    assert all(isinstance(line["seconds"], float) for line in printed)
    written = [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines()]
    assert written == printed


@pytest.mark.slow
def test_the_compiled_engine_keeps_its_invariants_in_the_tiny_check(tiny_check):
    by_stage = {line["stage"]: line for line in tiny_check[0]}
    engine = by_stage["engine"]
    for key in ("graph_breaks", "recompiles_after_warmup", "mutated_non_static_inputs", "cache_reallocations"):
        assert engine[key] == 0, key
    assert engine["cache_moved"] is False and engine["cudagraph_skips"] is None  # no CUDA here: null, not 0
    compiled = engine["engines"]["compiled"]
    assert compiled["graphs_compiled"] >= 1  # the window went through inductor (else the invariants say nothing)
    assert all(row["ms"] > 0 and row["over_floor"] > 0 for row in compiled["forwards"])
    run = by_stage["run"]
    assert run["compiled"]["returncode"] == run["eager"]["returncode"] == 0
    assert run["tokens_equal_to_eager"] == "2 of 2 images"  # AR and SJD, one prompt
    assert run["syncs_per_iteration"]["ar"] == 0 and run["syncs_per_iteration"]["sjd"] <= 1
    decoders = {r["decoder"] for r in by_stage["decoders"]["eager"]["decoders"]}  # tiny: eager only
    assert {"ar", "sjd_official", "scd_official_w64", "sjd_pac_official_w64", "csjd_gumbel_w64", "csjd_pac_w64",
            "eagle_sampled"} <= decoders  # fmt: skip
    assert (tiny_check[1] / "gpu_decoders.csv").exists() and (tiny_check[1] / "gpu_run.csv").exists()


@pytest.mark.slow
def test_the_check_page_shows_every_stage_of_the_latest_check(tiny_check):
    printed, _ = tiny_check
    page = render([{"stage": "start", "status": "ok", "device": "older"}, *printed])
    assert "older" not in page and "| engine | ok |" in page.replace("  ", " ")
    assert "The engine against the floor" in page and "`run.py` as a user types it" in page
    assert "mutated_non_static_inputs 0" in page


def test_a_stage_that_cannot_end_before_the_deadline_is_skipped_and_says_why():
    lines = main(["--tiny", "--device", "cpu", "--deadline-s", "0", "--stages", "device,engine"])
    assert [(line["stage"], line["status"]) for line in lines] == [
        ("start", "ok"), ("device", "skipped"), ("engine", "skipped")
    ]  # fmt: skip
    assert "left before the deadline" in lines[1]["reason"]


def test_a_failing_stage_is_a_line_with_its_error_and_the_check_goes_on():
    import torch

    check = Check(torch.device("cpu"), tiny=True, deadline_s=60, out=None, engine_layers=None)
    emitted = []

    def broken(_: Check) -> dict:
        raise RuntimeError("no such kernel")

    line = run_stage(check, "engine", broken, emitted.append)
    assert line["status"] == "failed" and "RuntimeError: no such kernel" in line["error"] and emitted == [line]
    ok = run_stage(check, "attention", lambda _: {"figure": 1}, emitted.append)
    assert ok["status"] == "ok" and ok["figure"] == 1 and check.found["attention"] == {"figure": 1}


def test_an_unknown_stage_or_a_missing_cuda_device_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["--stages", "device,kernels"])
    assert "--stages: unknown ['kernels']" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            main(["--device", "cuda"])
        assert "sees no CUDA device" in capsys.readouterr().err
