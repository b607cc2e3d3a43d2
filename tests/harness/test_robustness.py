"""Runs that are killed, resumed, pointed at the wrong directory, or fed bad numbers."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.prompts import load_prompt_file
from sjd.types import Logits

ROOT = Path(__file__).resolve().parents[2]
FAST = ["prompts.n=8", "batch_size=2", "warmup=0", "save_images=false", "results_csv=null", "eval=none",
        "decoder.window=4"]  # fmt: skip


def command(run_dir, *extra):
    return [sys.executable, str(ROOT / "run.py"), f"hydra.run.dir={run_dir}", *FAST, *extra]


def samples_of(run_dir: Path) -> dict:
    lines = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    keyed = {(x["decoder"], x["prompt_id"]): x["tokens"] for x in lines}
    assert len(keyed) == len(lines), "a (decoder, prompt) pair was written twice"
    return keyed


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """A finished run of FAST: what a killed run must resume to, and a run directory another config must not
    write into."""
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    subprocess.run(command(run_dir), check=True, capture_output=True, cwd=ROOT)
    return run_dir


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_samples(whole, tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.Popen(command(killed), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = killed / "samples.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (samples.is_file() and len(samples.read_text().splitlines()) >= 2):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # a real signal, mid-run
    proc.wait()
    partial = samples_of(killed)
    assert 2 <= len(partial) < 16 and not (killed / "summary.csv").exists()

    resumed = subprocess.run(command(killed), capture_output=True, text=True, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert samples_of(killed) == samples_of(whole)
    assert (killed / "summary.csv").is_file()


@pytest.mark.slow
def test_a_run_dir_of_another_config_is_refused(whole, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(whole, run_dir)  # the finished run, moved: a run directory is found by its contents
    kept = ("samples.jsonl", "summary.csv", "meta.json")
    before = [(run_dir / name).read_bytes() for name in kept]
    other = subprocess.run(command(run_dir, "decoder.window=8"), capture_output=True, text=True, cwd=ROOT)
    assert other.returncode != 0
    assert "different run config" in other.stderr and "hydra.run.dir" in other.stderr
    assert [(run_dir / name).read_bytes() for name in kept] == before  # nothing mixed in, nothing rewritten


@pytest.mark.parametrize("decoder", [SJDDecoder(window=8), ARDecoder()], ids=["sjd", "ar"])
def test_nan_logits_are_named_with_prompt_and_step(toy, monkeypatch, decoder):
    """Both read the NaN/inf flags with what they bring to the host anyway (SJD: with the accepted lengths; AR:
    at the end), and name the forward and the prompt."""
    prompts = load_prompt_file("sjd/assets/prompts/toy.tsv")[:2]
    real_forward, calls = type(toy).forward, {"n": 0}

    def poisoned(self, tokens, start):
        out = real_forward(self, tokens, start)
        calls["n"] += 1
        if calls["n"] == 3:
            out.cond[1, 0, 5] = float("nan")
        return Logits(out.cond, out.uncond)

    monkeypatch.setattr(type(toy), "forward", poisoned)
    gens = make_generators(0, [p.prompt_id for p in prompts], torch.device("cpu"))
    with pytest.raises(FloatingPointError, match=rf"\['{prompts[1].prompt_id}'\] at forward 4"):
        decoder.generate(toy, prompts, SamplingConfig(), gens)


def test_out_of_memory_names_batch_and_window_and_keeps_finished_samples(compose_cfg, tmp_path, monkeypatch):
    from sjd.harness.runner import run

    real_generate, calls = SJDDecoder.generate, {"n": 0}

    def oom_on_second_batch(self, adapter, prompts, sampling, generators):
        calls["n"] += 1
        if calls["n"] == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_generate(self, adapter, prompts, sampling, generators)

    monkeypatch.setattr(SJDDecoder, "generate", oom_on_second_batch)
    cfg = compose_cfg([*FAST, "prompts.n=4"])
    with pytest.raises(RuntimeError, match=r"batch_size=2, window=4\).*smaller batch_size to resume"):
        run(cfg, tmp_path)
    finished = samples_of(tmp_path)
    assert len(finished) >= 2 and not (tmp_path / "summary.csv").exists()


def test_the_immediate_nan_check_names_the_branch_and_rows():
    """The check decoders without a per-forward read use (the prefill's, and tree and PJD loops)."""
    from sjd.decoders.base import check_finite

    cond, uncond = torch.zeros(3, 2, 5), torch.zeros(3, 2, 5)
    check_finite(Logits(cond, uncond), "toy", ["a", "b", "c"], 2)  # finite: nothing happens
    uncond[2, 1, 0] = float("inf")
    with pytest.raises(FloatingPointError, match=r"unconditional logits for prompt\(s\) \['c'\] at forward 2"):
        check_finite(Logits(cond, uncond), "toy", ["a", "b", "c"], 2)
