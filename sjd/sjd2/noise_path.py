"""SJD2's noise-aware input path (docs/algorithms.md §10), for any model with an input-embedding table.

One implementation for the toy, the micro audit model and the real (Lumina-mGPT, Emu3) models:
- Embedding normalisation: every input embedding (clean or noisy, prompt included) is scaled to
  unit RMS and then by one constant `scale`, so clean embeddings and Gaussian noise live on one
  scale ("without it denoising fails"). The toy uses scale 1; a real model keeps its own input
  magnitude (the RMS of its embedding table, fixed when its fine-tune starts), so the fine-tune
  starts near the pretrained model.
- Noise path: x_t = (1 - t) * e_hat + t * scale * eps, t in [0, 1] (a rectified-flow
  interpolation; t = 1 is pure noise), discretised into `n_levels` levels, level 0 = clean.
- Timestep signal: a learned per-level embedding added to the input embedding, zero-initialised
  so that fine-tuning starts from the AR model.

`NoisePath` owns the timestep embedding (key `time_embed.weight`) and nothing else, so a real
model's checkpoint keeps the base model's own weight files and adds a small sidecar
(`noise_aware.safetensors` + `noise_aware.json`, see `save_sidecar`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

N_LEVELS = 32
SIDECAR_WEIGHTS = "noise_aware.safetensors"
SIDECAR_META = "noise_aware.json"
FORMAT = "sjd2-noise-aware"
FORMAT_VERSION = 1
NOISE_PATH = "rectified_flow: x_t = (1 - t) * e_hat + t * scale * eps, t = level / (noise_levels - 1)"


class NoisePath(nn.Module):
    def __init__(self, hidden_size: int, n_levels: int = N_LEVELS, scale: float = 1.0, eps: float = 1e-6) -> None:
        super().__init__()
        self._init_path(hidden_size, n_levels, scale, eps)

    def _init_path(self, hidden_size: int, n_levels: int, scale: float = 1.0, eps: float = 1e-6) -> None:
        if n_levels < 2:
            raise ValueError(f"a noise path needs at least 2 levels (clean and pure noise), got {n_levels}")
        self.n_levels, self.scale, self.eps = int(n_levels), float(scale), float(eps)
        self.time_embed = nn.Embedding(self.n_levels, hidden_size)
        nn.init.zeros_(self.time_embed.weight)

    @classmethod
    def for_table(cls, table: torch.Tensor, n_levels: int = N_LEVELS) -> NoisePath:
        """A fresh path whose scale is the RMS of an input-embedding table [vocab, D]."""
        scale = float(table.detach().float().pow(2).mean().sqrt())
        return cls(table.shape[1], n_levels, scale)

    @property
    def hidden_size(self) -> int:
        return self.time_embed.embedding_dim

    def level_to_t(self, levels: torch.Tensor) -> torch.Tensor:
        return levels.float() / (self.n_levels - 1)

    def clean(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Token embeddings [.., D] -> the e_hat that noise is mixed with (unit RMS times `scale`).
        The RMS is taken in float32 so that a bfloat16 model normalises as finely as a float32 one."""
        e = embeddings.float()
        e_hat = e * torch.rsqrt(e.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.scale != 1.0:
            e_hat = e_hat * self.scale
        return e_hat.to(embeddings.dtype)

    def noisy(self, clean: torch.Tensor, levels: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """x_t of `clean` [.., D] at `levels` [..] with standard-normal `noise` [.., D]."""
        t = self.level_to_t(levels).unsqueeze(-1).to(clean.dtype)
        noise = noise.to(clean.dtype)
        if self.scale != 1.0:
            noise = noise * self.scale
        return (1 - t) * clean + t * noise

    def inputs(self, embeds: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
        """What the model's first layer reads: the (noisy) embeddings plus their level's timestep embedding."""
        return embeds + self.time_embed(levels)

    def meta(self) -> dict:
        """The path's settings as `noise_aware.json` records them."""
        return {
            "noise_levels": self.n_levels,
            "noise_path": NOISE_PATH,
            "embedding_normalisation": {"kind": "unit_rms", "eps": self.eps, "scale": self.scale},
            "timestep": "learned per-level embedding added to the input embedding (time_embed.weight)",
            "hidden_size": self.hidden_size,
        }


def save_sidecar(path: NoisePath, directory: Path, meta: dict) -> None:
    """Write `noise_aware.safetensors` (the timestep embedding) and `noise_aware.json` (the path's
    settings plus `meta`: base model id, family, training settings) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    weight = path.time_embed.weight.detach().float().contiguous().cpu()
    save_file({"time_embed.weight": weight}, str(directory / SIDECAR_WEIGHTS), metadata={"format": FORMAT})
    payload = {"format": FORMAT, "version": FORMAT_VERSION, **path.meta(), **meta}
    (directory / SIDECAR_META).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def load_sidecar(directory: Path, what: str, config_key: str, recipe: str) -> tuple[NoisePath, dict]:
    """The NoisePath and metadata of a noise-aware checkpoint directory (safetensors only). A missing
    file is reported with its path, the config key that points at the directory and `recipe`, the
    command that makes such a checkpoint."""
    weights, meta_file = directory / SIDECAR_WEIGHTS, directory / SIDECAR_META
    for f in (meta_file, weights):
        if not f.is_file():
            raise FileNotFoundError(
                f"{what}: {f} not found, so {directory} is not an SJD2 noise-aware checkpoint. Set `{config_key}` "
                f"to a directory made by {recipe} (the base model's weight files plus {SIDECAR_WEIGHTS} and "
                f"{SIDECAR_META})."
            )
    meta = json.loads(meta_file.read_text())
    if meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{what}: {meta_file} is not a {FORMAT} v{FORMAT_VERSION} file (format={meta.get('format')!r}, "
            f"version={meta.get('version')!r}); remake the checkpoint with {recipe}"
        )
    norm = meta["embedding_normalisation"]
    if norm.get("kind") != "unit_rms" or meta.get("noise_path") != NOISE_PATH:
        raise ValueError(f"{what}: {meta_file} asks for a noise path or normalisation this code does not implement")
    path = NoisePath(int(meta["hidden_size"]), int(meta["noise_levels"]), float(norm["scale"]), float(norm["eps"]))
    path.load_state_dict(load_file(str(weights)), strict=True)
    return path.eval(), meta
