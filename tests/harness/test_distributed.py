"""Data-parallel runs: torchrun with 2 CPU ranks gives one process's samples; a failing rank stops the
job with its message and the run resumes; the merge, the sharding and the barrier timeout."""

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from sjd.harness.distributed import DataParallel, shard
from sjd.harness.ranks import RankInfo, rank_info
from sjd.harness.results import merge_samples, shard_file

ROOT = Path(__file__).resolve().parents[2]
# The default config shrunk; its toy FID/CLIP eval stays on (rank 0 scores the merged samples).
FAST = ["prompts.n=4", "batch_size=2", "warmup=0", "results_csv=null", "decoder.window=4", "logger=csv"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
KEYS = [(d, f"toy00{i}") for i in range(4) for d in ("ar", "sjd")]  # prompt order, then decoder order
STEP_COLUMNS = ["decoder", "n_prompts", "n_forward", "step_compression", "mean_accepted", "accept_hist"]


def run_py(nproc: int, *overrides: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """run.py as one process, or under torchrun with `nproc` ranks on a free port."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    command = [*(launcher if nproc > 1 else [sys.executable]), str(ROOT / "run.py"), *FAST, *overrides]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=ENV, timeout=300)


def samples_of(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]


def keys_of(samples: list[dict]) -> list[tuple[str, str]]:
    return [(x["decoder"], x["prompt_id"]) for x in samples]


def decoded(samples: list[dict]) -> dict:
    return {(x["decoder"], x["prompt_id"]): (x["tokens"], x["accepted"], x["seed"]) for x in samples}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("one") / "run"
    proc = run_py(1, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_two_ranks_write_the_samples_of_one_process(one_process, tmp_path):
    # No hydra.run.dir: each rank's Hydra names its own folder, and the ranks must still share one.
    proc = run_py(2, "save_images=true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list((tmp_path / "outputs" / "runs").iterdir())
    assert len(runs) == 1, runs
    run_dir = runs[0]

    merged = samples_of(run_dir)
    assert keys_of(merged) == KEYS  # every (decoder, prompt) once, in prompt order
    assert keys_of(samples_of(one_process)) == KEYS
    assert decoded(merged) == decoded(samples_of(one_process))
    assert not list(run_dir.glob("samples.rank*.jsonl"))  # merged, then removed
    for decoder in ("ar", "sjd"):  # both ranks saved their images into the shared directory
        assert sorted(p.name for p in (run_dir / "images" / decoder).glob("*.png")) == [
            f"toy00{i}.png" for i in range(4)
        ]
    assert (run_dir / "grid.png").is_file() and (run_dir / ".hydra" / "config.yaml").is_file()

    two, one = pd.read_csv(run_dir / "summary.csv"), pd.read_csv(one_process / "summary.csv")
    pd.testing.assert_frame_equal(two[STEP_COLUMNS], one[STEP_COLUMNS])
    # Scored once, by rank 0 alone, on the same images as the one-process run.
    assert two["fid"].notna().all() and two["clip"].notna().all()
    pd.testing.assert_frame_equal(two[["fid", "clip"]], one[["fid", "clip"]], rtol=1e-6)
    assert list(two["world_size"]) == [2, 2] and list(one["world_size"]) == [1, 1]
    assert json.loads((run_dir / "meta.json").read_text())["world_size"] == 2


@pytest.mark.slow
def test_a_failing_rank_stops_the_job_with_its_message_and_the_run_resumes(one_process, tmp_path):
    run_dir = tmp_path / "run"
    # Rank 1 decodes toy001 and toy003 (round-robin); a directory where toy003's AR image goes makes
    # saving it fail on rank 1 only, after its toy001 sample is on record.
    blocker = run_dir / "images" / "ar" / "toy003.png"
    blocker.mkdir(parents=True)
    failed = run_py(2, f"hydra.run.dir={run_dir}", "save_images=true", "dist_timeout_min=10", "eval=none")
    # It returns long before the 10-minute barrier timeout: torchrun stops rank 0 when rank 1 fails.
    assert failed.returncode != 0
    assert "Is a directory" in failed.stderr and "toy003" in failed.stderr
    assert "rank 1 of 2 failed" in failed.stdout + failed.stderr
    assert keys_of([json.loads(x) for x in shard_file(run_dir, 1).read_text().splitlines()]) == [("ar", "toy001")]
    assert not (run_dir / "summary.csv").exists()

    blocker.rmdir()
    # The same command resumes; here with one process, which takes over both ranks' shards.
    resumed = run_py(1, f"hydra.run.dir={run_dir}", "save_images=true", "dist_timeout_min=10", "eval=none")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stderr + resumed.stdout
    merged = samples_of(run_dir)
    assert keys_of(merged) == KEYS and decoded(merged) == decoded(samples_of(one_process))
    assert not list(run_dir.glob("samples.rank*.jsonl")) and (run_dir / "summary.csv").is_file()


def test_merge_keeps_one_line_per_sample_in_prompt_order_and_refuses_conflicts(tmp_path):
    def line(decoder, prompt, tokens):
        return json.dumps({"decoder": decoder, "prompt_id": prompt, "tokens": tokens}) + "\n"

    (tmp_path / "samples.jsonl").write_text(line("ar", "b", [1]))  # an earlier merge ...
    shard_file(tmp_path, 0).write_text(line("sjd", "b", [2]) + line("ar", "a", [3]))
    shard_file(tmp_path, 1).write_text(line("ar", "b", [1]) + line("sjd", "a", [4]) + '{"decod')  # ... a half line
    merge_samples(tmp_path, ["ar", "sjd"], ["a", "b"])
    assert (tmp_path / "samples.jsonl").read_text() == line("ar", "a", [3]) + line("sjd", "a", [4]) + line(
        "ar", "b", [1]
    ) + line("sjd", "b", [2])
    assert not list(tmp_path.glob("samples.rank*"))

    shard_file(tmp_path, 3).write_text(line("ar", "a", [9]))
    with pytest.raises(ValueError, match="different sample of decoder 'ar' on prompt 'a'"):
        merge_samples(tmp_path, ["ar", "sjd"], ["a", "b"])
    shard_file(tmp_path, 3).unlink()
    with pytest.raises(ValueError, match=r"missing \[\('ar', 'c', 0\), \('sjd', 'c', 0\)\]"):
        merge_samples(tmp_path, ["ar", "sjd"], ["a", "b", "c"])


def test_rank_info_and_round_robin_shards():
    assert rank_info({}) == RankInfo(0, 1, 0) and not rank_info({}).distributed
    info = rank_info({"WORLD_SIZE": "3", "RANK": "2", "LOCAL_RANK": "0"})
    assert (info.rank, info.world_size, info.local_rank, info.is_main) == (2, 3, 0, False)
    with pytest.raises(ValueError, match="RANK is not"):
        rank_info({"WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="RANK=2, LOCAL_RANK=2, WORLD_SIZE=2"):
        rank_info({"WORLD_SIZE": "2", "RANK": "2"})
    items = list(range(7))
    shards = [shard(items, RankInfo(r, 3, r)) for r in range(3)]
    assert shards == [[0, 3, 6], [1, 4], [2, 5]]
    assert sorted(sum(shards, [])) == items


def _wait_at_barrier(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dp = DataParallel.start(RankInfo(rank, 2, rank), "cpu", timedelta(seconds=3))
    if rank == 1:
        results.put((rank, "started", 0.0))
        time.sleep(30)  # alive, but never at the barrier
        return
    t0 = time.perf_counter()
    try:
        dp.barrier("the test barrier")
        results.put((rank, "passed", time.perf_counter() - t0))
    except RuntimeError as e:
        results.put((rank, str(e), time.perf_counter() - t0))


def test_a_rank_missing_at_a_barrier_fails_after_the_timeout_instead_of_hanging():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")  # no re-import of torch in the children: seconds saved
    results = ctx.Queue()
    procs = [ctx.Process(target=_wait_at_barrier, args=(r, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = {rank: (message, waited) for rank, message, waited in (results.get(timeout=120) for _ in range(2))}
    for p in procs:
        p.kill()
        p.join()
    message, waited = got[0]
    assert got[1][0] == "started"
    assert "rank 0 of 2 gave up waiting for the other ranks (the test barrier)" in message
    assert "dist_timeout_min" in message
    assert 2.5 < waited < 20  # the 3 s timeout, not rank 1's exit after 30 s (nor torch's default 30 min)
