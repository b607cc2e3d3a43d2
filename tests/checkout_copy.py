"""A fresh git checkout of this working tree, for tests of what a user's own checkout goes through."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def checkout_copy(dest: Path) -> Path:
    """`git clone` of this repository at HEAD into `dest`, then the working tree's own files (tracked
    and not ignored, edits not yet committed included) committed on top, so the copy is a clean checkout
    of the code under test."""
    git(ROOT, "rev-parse", "HEAD")  # fails clearly outside a git checkout
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(dest)], check=True)
    git(dest, "checkout", "-q", git(ROOT, "rev-parse", "HEAD").strip())
    ours = set(git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")) - {""}
    ours = {f for f in ours if (ROOT / f).is_file()}  # a deleted, not yet committed file is not ours
    for f in set(git(dest, "ls-files", "-z").split("\0")) - {""} - ours:
        (dest / f).unlink()
    for f in ours:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest / f)
    git(dest, "add", "-A")
    if git(dest, "status", "--porcelain"):
        ident = ["-c", "user.name=test", "-c", "user.email=test@localhost"]
        git(dest, *ident, "commit", "-q", "-m", "the working tree under test")
    return dest


def checkout_env(checkout: Path) -> dict[str, str]:
    """The environment of a command run in `checkout`: its own `sjd` first on the path."""
    return {**os.environ, "PYTHONPATH": str(checkout), "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}


def python_in(checkout: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python <args>` run in `checkout`, as a user would type it there."""
    return subprocess.run(
        [sys.executable, *args], cwd=checkout, env=checkout_env(checkout), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
