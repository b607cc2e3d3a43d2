"""The noise-aware toy model of SJD2 (docs/algorithms.md §10): next-clean-token prediction.

SJD2 fine-tunes an AR model so that some of its inputs may be noisy token embeddings while the
target stays the next *clean* token. The input path (unit-RMS embeddings, the rectified-flow
noise path over N_LEVELS levels, the zero-initialised timestep embedding) is the one every
noise-aware model shares, sjd.sjd2.noise_path.NoisePath; the toy uses it at scale 1.

The module wraps the toy `LlamaForCausalLM` and feeds it `inputs_embeds`, so the transformers
cache, masks and positions work exactly as for the plain toy model. Its checkpoint keeps the
format it was made in (model.safetensors with keys `lm.*` and `time_embed.weight`, config.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from sjd.sjd2.noise_path import N_LEVELS, NoisePath
from sjd.toy.model import TEXT_CONTEXT, build_toy_model


class NoiseAwareLM(NoisePath):
    """A NoisePath (scale 1) together with the LM it feeds: one module, one state dict."""

    def __init__(self, lm: LlamaForCausalLM) -> None:
        # The LM is registered before the timestep embedding, as when the shipped checkpoint was
        # trained: parameter order fixes the summation order of gradient clipping, so the fine-tune
        # script still reproduces sjd/assets/toy_sjd2 exactly.
        nn.Module.__init__(self)
        self.lm = lm
        self._init_path(lm.config.hidden_size, N_LEVELS)

    @property
    def config(self) -> LlamaConfig:
        return self.lm.config

    def get_input_embeddings(self) -> nn.Module:
        return self.lm.get_input_embeddings()

    def clean_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        """Unit-RMS token embeddings: the e_hat that noise is mixed with."""
        return self.clean(self.lm.get_input_embeddings()(ids))

    def forward(self, inputs_embeds: torch.Tensor, levels: torch.Tensor, **kwargs):
        """`inputs_embeds` [B, T, D] (already mixed with noise), `levels` [B, T] their noise levels."""
        return self.lm(inputs_embeds=self.inputs(inputs_embeds, levels), **kwargs)


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
