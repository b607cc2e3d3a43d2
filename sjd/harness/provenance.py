"""Provenance recorded with every result: git hash, library versions, the run command, peak memory.
(Each prompt's seed is sjd.core.seeding's, which the audit shares.)"""

from __future__ import annotations

import importlib.metadata
import platform
import resource
import subprocess
import sys

import torch

from sjd.harness.prompts import PROJECT_ROOT

LIBRARIES = ("torch", "transformers", "hydra-core", "omegaconf", "numpy", "pandas", "safetensors")


def run_command() -> str | None:
    """The command line of this run as `python run.py <overrides>`, or None outside run.py (compose API).
    Hydra's own overrides (hydra.run.dir=..., hydra/launcher=...) are left out: they say where a run
    goes, not what it computes, so a run resumed in a given directory names the command it completes."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    overrides = [o for o in HydraConfig.get().overrides.task if not o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    return " ".join(["python run.py", *overrides])


OUTPUT_PATHS = ("results", "docs/results")


def git_hash() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            # Tracked results tables and their generated pages are outputs of study commands, not
            # inputs: a study appending its rows must not mark the next study's rows as dirty.
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *(f":!{p}" for p in OUTPUT_PATHS)],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0], "platform": platform.platform()}
    for lib in LIBRARIES:
        try:
            found[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            found[lib] = "absent"
    return found


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> tuple[float, str]:
    """GPU: peak allocated since the last reset. CPU: the process's peak resident set (it
    cannot be split between decoders of one process, so every decoder reports the same)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process_rss"
