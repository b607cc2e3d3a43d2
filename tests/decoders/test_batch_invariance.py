"""`scripts/batch_invariance.py` (sjd/bench/batch_invariance.py): a prompt's tokens alone and in a batch.

Bitwise equality at the model's own precision is asserted only on the toy (the decoder contract does the same
for every decoder on the tiny models); at a stand-in's size float32 rounding of batched kernels may part the two
trajectories, which is machine-dependent, so there the check runs in float64, where a parting would point at the
batching itself (docs/design.md §3).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sjd.bench import batch_invariance

ROOT = Path(__file__).resolve().parents[2]


def script(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "scripts" / "batch_invariance.py"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)


def test_the_toy_decodes_each_prompt_alone_as_in_its_batch():
    done = script("toy", "sjd", "--prompts", "3", "--check")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("  toy")]
    assert len(lines) == 3 and all(": equal;" in line for line in lines), done.stdout


def test_a_stand_in_in_float64_decodes_each_prompt_alone_as_in_its_batch():
    """The 512 px calibrated stand-in's layout (1061 steps, left-padded captions of different lengths) with a
    coupled decoder, whose trajectories are the longest-lived: in double precision nothing but the batching
    could part them."""
    done = script("standin_lumina_512_cal", "csjd", "--prompts", "2", "--float64", "--check")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert done.stdout.count(": equal;") == 2, done.stdout


def test_check_exits_1_when_a_prompt_parts_from_its_batch(monkeypatch, capsys):
    parted = {"prompt": "p0", "equal": False, "first_difference": 7, "n_tokens": 9, "forwards_alone": 4,
              "forwards_in_batch": 5}  # fmt: skip
    same = {**parted, "prompt": "p1", "equal": True, "first_difference": -1}
    monkeypatch.setattr(batch_invariance, "compare", lambda *a: [parted, same])
    assert batch_invariance.main(["toy", "sjd", "--check"]) == 1
    assert "p0: parts at token 7 of 9; forwards alone 4, in the batch 5" in capsys.readouterr().out
    assert batch_invariance.main(["toy", "sjd"]) == 0  # without --check it only reports


def test_one_prompt_is_not_a_batch():
    with pytest.raises(SystemExit):
        batch_invariance.main(["toy", "sjd", "--prompts", "1"])
