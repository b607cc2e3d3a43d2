"""The real architectures (sjd.models.real_architectures) as the benches build them: at the resolution and with
the sampling settings their model configs (`conf/model/<name>.yaml`) give."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from sjd.core.sampling import SamplingConfig
from sjd.models.real_architectures import BUILDERS, MODELS, PROMPT, Built

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["MODELS", "PROMPT", "ROOT", "Built", "build", "model_conf", "sampling_for"]


def model_conf(name: str) -> DictConfig:
    """conf/model/<name>.yaml."""
    return OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml")


def sampling_for(name: str) -> SamplingConfig:
    """The model config's sampling settings."""
    s = model_conf(name).sampling
    return SamplingConfig(cfg_scale=s.cfg_scale, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)


def build(name: str, tiny: bool, device: torch.device, dtype: torch.dtype, layers: int | None = None) -> Built:
    """Real architecture `name` with random weights at its config's resolution (`layers`: cut to that depth)."""
    if name not in BUILDERS:
        raise ValueError(f"unknown real architecture {name!r}; known: {list(BUILDERS)}")
    resolution = int(model_conf(name).adapter.get("resolution", 384))
    return BUILDERS[name](tiny, device, dtype, resolution, layers)
