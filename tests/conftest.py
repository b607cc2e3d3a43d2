"""Shared fixtures: the shipped toy adapter, a tiny random Llama, and Hydra composition."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from sjd.harness.config import register_resolvers
from sjd.harness.decoder_configs import settle_named_rows

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("WANDB_MODE", "offline")
register_resolvers()
# One process (`python -m pytest`): two torch threads. Under pytest-xdist (`make test` runs two workers): one
# thread a worker, and one for each process a test starts, so the workers do not fight over two cores. A test
# whose numbers depend on a thread count sets that count itself (e.g. the drafter recipe checks).
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only possible before the first inter-op work; then the default stays
        pass
else:
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def toy():
    from sjd.models.toy import ToyAdapter

    return ToyAdapter()


_COMPOSED: dict[tuple[str, ...], object] = {}  # overrides -> the composed run config, once a test process


@pytest.fixture
def compose_cfg():
    """compose_cfg(overrides) -> the run config as run.py would see it. Each override list is composed once a test
    process and handed out as a deep copy, so a test may change its config freely: Hydra's compose costs a
    quarter of a second here, and several tests compose every study command (interpolations such as the run
    directory's time stay unresolved in the copy, as in a fresh compose)."""

    def _compose(overrides=()):
        key = tuple(overrides)
        if key not in _COMPOSED:
            GlobalHydra.instance().clear()
            with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
                _COMPOSED[key] = settle_named_rows(compose("config", overrides=list(overrides)))
        return copy.deepcopy(_COMPOSED[key])

    yield _compose
    GlobalHydra.instance().clear()


@pytest.fixture(scope="session")
def run_audit():
    """run_audit(overrides) -> the report of scripts/audit.py for conf/audit.yaml + overrides. AR's reference
    draws are kept across the session's audits of one model (audit_report's `shared`): the same report, AR
    drawn once instead of once a decoder.

    The one-sample teacher-forced audit of the samples runs only where the overrides ask for it
    (`teacher_forced=true`): these audits assert the exact test, the stronger one on an enumerable model, and
    every lossless decoder's one-sample audit is asserted at its own size in tests/audit/test_teacher_forced.py.
    Left on, it would cost each of some fifty 20,000-sample audits a teacher-forced pass nothing reads."""
    from sjd.audit.driver import audit_report

    shared: dict = {}

    def _run(overrides):
        if not any(o.startswith("teacher_forced=") for o in overrides):
            overrides = [*overrides, "teacher_forced=false"]
        GlobalHydra.instance().clear()
        with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
            cfg = compose("audit", overrides=list(overrides))
        GlobalHydra.instance().clear()
        return audit_report(cfg, shared)

    return _run


@pytest.fixture(autouse=True)
def _threads_restored():
    """A test that sets torch's thread count (a drafter recipe's build sets the recipe's) leaves the next test
    the count it found."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models' ops are far too small to split; on a busy machine a second thread mostly waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
