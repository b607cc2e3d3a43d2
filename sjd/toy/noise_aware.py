"""The noise-aware toy model of SJD2 (algorithms.md §5): next-clean-token prediction.

SJD2 fine-tunes an AR model so that some of its inputs may be noisy token embeddings while the
target stays the next *clean* token. Our choices where the notes leave room:
- Embedding normalisation: every input embedding (clean or noisy) is scaled to unit RMS, so
  clean embeddings and Gaussian noise live on one scale ("without it denoising fails").
- Noise path: x_t = (1 - t) * e_hat + t * eps, t in [0, 1] (a rectified-flow interpolation;
  t = 1 is pure noise). `t` is discretised into N_LEVELS levels; level 0 is clean.
- Timestep signal: a learned per-level embedding added to the input embedding (zero-initialised,
  so fine-tuning starts from the AR model). Clean tokens, the prompt included, get level 0.

The module wraps the toy `LlamaForCausalLM` and feeds it `inputs_embeds`, so the transformers
cache, masks and positions work exactly as for the plain toy model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from sjd.toy.model import TEXT_CONTEXT, build_toy_model

N_LEVELS = 32


def level_to_t(levels: torch.Tensor) -> torch.Tensor:
    return levels.float() / (N_LEVELS - 1)


class NoiseAwareLM(nn.Module):
    def __init__(self, lm: LlamaForCausalLM) -> None:
        super().__init__()
        self.lm = lm
        self.time_embed = nn.Embedding(N_LEVELS, lm.config.hidden_size)
        nn.init.zeros_(self.time_embed.weight)

    @property
    def config(self) -> LlamaConfig:
        return self.lm.config

    def clean_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        """Unit-RMS token embeddings: the e_hat that noise is mixed with."""
        e = self.lm.get_input_embeddings()(ids)
        return e * torch.rsqrt(e.pow(2).mean(-1, keepdim=True) + 1e-6)

    def noisy(self, clean: torch.Tensor, levels: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        t = level_to_t(levels).unsqueeze(-1).to(clean.dtype)
        return (1 - t) * clean + t * noise

    def forward(self, inputs_embeds: torch.Tensor, levels: torch.Tensor, **kwargs):
        """`inputs_embeds` [B, T, D] (already mixed with noise), `levels` [B, T] their noise levels."""
        return self.lm(inputs_embeds=inputs_embeds + self.time_embed(levels), **kwargs)


def save_noise_aware(model: NoiseAwareLM, directory: Path, meta: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"))
    payload = {"llama": model.config.to_dict(), "text_context": TEXT_CONTEXT, "noise_levels": N_LEVELS, **meta}
    (directory / "config.json").write_text(json.dumps(payload, indent=2, sort_keys=True))


def load_noise_aware(directory: str | Path, config_key: str = "model.adapter.weights") -> tuple[NoiseAwareLM, dict]:
    """Load an SJD2 toy checkpoint; a plain toy checkpoint is refused with the reason."""
    directory = Path(directory)
    weights, cfg_file = directory / "model.safetensors", directory / "config.json"
    for f in (weights, cfg_file):
        if not f.is_file():
            raise FileNotFoundError(
                f"toy SJD2 model: {f} not found. Set `{config_key}` to a directory holding the noise-aware "
                "checkpoint (make it with scripts/finetune_sjd2.py)."
            )
    meta = json.loads(cfg_file.read_text())
    if meta.get("noise_levels") != N_LEVELS:
        raise ValueError(
            f"toy SJD2 model: {directory} is not a noise-aware checkpoint (config.json has no "
            f"noise_levels={N_LEVELS}); fine-tune one with scripts/finetune_sjd2.py and set `{config_key}`"
        )
    model = NoiseAwareLM(build_toy_model(LlamaConfig(**meta["llama"])))
    model.load_state_dict(load_file(str(weights)))
    return model.eval(), meta
