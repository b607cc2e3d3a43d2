"""run.py end to end: the files of a run, the results row, W&B offline, bad input, run dirs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_FIELDS = {"prompt_id", "prompt", "seed", "decoder", "n_tokens", "n_forward", "latency_s", "accepted", "tokens"}
SUMMARY_FIELDS = {
    "model",
    "decoder",
    "n_prompts",
    "n_captions",
    "n_tokens",
    "n_forward",
    "step_compression",
    "latency_s",
    "latency_speedup",
    "accept_hist",
    "peak_mem_mb",
    "decoder_configs",
    "git_hash",
    "versions",
    "prompt_file_sha256",
    "seed",
    "sampling",
    "step_compression_lo",
    "step_compression_hi",
    "latency_speedup_lo",
    "latency_speedup_hi",
    "n_forward_se",
    "latency_s_se",
    "load_1min_start",
    "cpu_per_wall",
    "latency_reliable",
}


def run_py(*overrides, cwd=ROOT, env=None):
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *overrides],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "WANDB_MODE": "offline", **(env or {})},
    )


@pytest.mark.slow
def test_default_run_writes_every_output(tmp_path):
    run_dir, results = tmp_path / "run", tmp_path / "results.csv"
    proc = run_py(f"hydra.run.dir={run_dir}", "prompts.n=3", f"results_csv={results}", "logger=wandb")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step_compression" in proc.stdout  # the final table

    lines = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 6 and {x["decoder"] for x in lines} == {"ar", "sjd"}
    for x in lines:
        assert SAMPLE_FIELDS <= set(x)
        assert len(x["tokens"]) == x["n_tokens"] == sum(x["accepted"])
        assert len(x["accepted"]) == x["n_forward"]
    for decoder in ("ar", "sjd"):
        assert len(list((run_dir / "images" / decoder).glob("*.png"))) == 3
    assert (run_dir / "grid.png").stat().st_size > 0

    summary = pd.read_csv(run_dir / "summary.csv")
    assert SUMMARY_FIELDS <= set(summary.columns)
    rows = summary.set_index("decoder")
    assert rows.loc["ar", "step_compression"] == 1.0 and rows.loc["ar", "latency_speedup"] == 1.0
    assert rows.loc["sjd", "step_compression"] > 1.0
    sjd = rows.loc["sjd"]
    assert sjd["step_compression_lo"] <= sjd["step_compression"] <= sjd["step_compression_hi"]
    assert sjd["latency_speedup_lo"] <= sjd["latency_speedup_hi"] and sjd["latency_units"] == 3  # batch_size 1
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["cpu_per_wall"] > 0 and meta["usable_cores"] >= 1 and isinstance(meta["latency_reliable"], bool)
    assert ("latency columns UNRELIABLE" in proc.stdout) == (not meta["latency_reliable"])
    assert json.loads((run_dir / "summary.json").read_text())[0]["model"] == "toy"
    assert len(pd.read_csv(results)) == 2

    # W&B ran offline and wrote its run record into the run directory.
    records = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(records) == 1 and records[0].stat().st_size > 0
    assert list((run_dir / "wandb").glob("offline-run-*/files/media/table/*.table.json"))


@pytest.mark.slow
def test_latency_intervals_resample_the_timed_batches(tmp_path):
    """`python run.py batch_size=4 prompts.n=16`: the latency speedup's and efficiency's intervals are over the
    4 timed batches each decoder ran (each paired with AR's batch of the same prompts), and none is zero-width;
    every sample records the batch it was timed in."""
    run_dir = tmp_path / "run"
    proc = run_py(f"hydra.run.dir={run_dir}", "batch_size=4", "prompts.n=16", "results_csv=null", "save_images=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {x["decoder"] for x in lines} == {"ar", "sjd"}
    for decoder in ("ar", "sjd"):
        batches = {x["timed_batch"] for x in lines if x["decoder"] == decoder}
        assert len(batches) == 4, batches
    sjd = pd.read_csv(run_dir / "summary.csv").set_index("decoder").loc["sjd"]
    assert sjd["latency_units"] == 4
    assert sjd["latency_speedup_lo"] < sjd["latency_speedup_hi"] and sjd["efficiency_lo"] < sjd["efficiency_hi"]


@pytest.mark.slow
def test_two_runs_started_together_get_different_directories(tmp_path):
    args = [
        sys.executable,
        str(ROOT / "run.py"),
        "decoder=ar",
        "~baseline",
        "prompts.n=1",
        "warmup=0",
        "save_images=false",
        "results_csv=null",
    ]
    procs = [subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    runs = list((tmp_path / "outputs" / "runs").iterdir())
    assert len(runs) == 2 and all((r / "summary.csv").is_file() for r in runs)


def test_a_prompt_the_model_cannot_take_is_named_before_any_work(tmp_path):
    prompts = tmp_path / "p.tsv"
    prompts.write_text(
        "id\tPrompt\nok1\tlarge red circle center on blue\nbad7\tlarge red circle " + "and " * 30 + "on blue\n"
    )
    run_dir = tmp_path / "run"
    proc = run_py(f"hydra.run.dir={run_dir}", "prompts=file", f"prompts.path={prompts}", "results_csv=null")
    assert proc.returncode != 0
    assert "'bad7'" in proc.stderr
    assert not (run_dir / "summary.csv").exists()


@pytest.mark.slow
def test_pjd_and_sjd2_run_end_to_end(tmp_path):
    for overrides in (["decoder=pjd"], ["model=toy_sjd2", "decoder=sjd2"]):
        name = overrides[-1].split("=")[1]
        run_dir = tmp_path / name
        proc = run_py(f"hydra.run.dir={run_dir}", "prompts.n=2", "warmup=0", "results_csv=null", *overrides)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary = pd.read_csv(run_dir / "summary.csv").set_index("decoder")
        assert summary.loc[name, "step_compression"] > 1.0
        assert summary.loc["ar", "model"] == summary.loc[name, "model"]  # AR runs the same model


def test_a_decoder_the_model_cannot_serve_fails_before_any_work(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_py(f"hydra.run.dir={run_dir}", "decoder=sjd2", "prompts.n=2", "results_csv=null")
    assert proc.returncode != 0
    assert "'sjd2' needs model capabilities ['embeds']" in proc.stderr and "'toy'" in proc.stderr
    assert not (run_dir / "summary.csv").exists() and not (run_dir / "samples.jsonl").exists()
