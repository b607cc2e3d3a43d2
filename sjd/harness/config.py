"""OmegaConf resolvers used by the configs under conf/."""

from __future__ import annotations

import os
import uuid

from omegaconf import OmegaConf


def _run_id() -> str:
    # Process id plus randomness: two runs started in the same second get different folders.
    return f"{os.getpid()}-{uuid.uuid4().hex[:6]}"


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("run_id"):
        # use_cache: the run directory is resolved several times per run and must not change.
        OmegaConf.register_new_resolver("run_id", _run_id, use_cache=True)
