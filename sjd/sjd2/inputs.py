"""The `embeds` capability (SJD2) for any CausalLMAdapter, through one NoisePath (sjd/sjd2/noise_path.py).

Every model call goes through the noise-aware input path (unit-RMS embeddings plus the
timestep embedding), clean tokens at level 0, so AR, SJD and SJD2 all decode the same model
and compare fairly. SJD2's window inputs come in as noisy embeddings; the noise schedule stays
with the model that was trained on it.

The adapter provides `noise_path` and, through CausalLMAdapter, `_run_embeds` (one model call
on input embeddings: the plain LM for Emu3, backbone + lm_head for Chameleon). The toy and micro
models, whose `model` is a NoiseAwareLM (path and LM in one module), use `NoiseAwareLMInputs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from sjd.sjd2.noise_path import NoisePath, load_sidecar, save_sidecar
from sjd.sjd2.toy_net import NoiseAwareLM
from sjd.types import CUSTOM_MASK, EMBEDS, WINDOW, Logits

RECIPE = "scripts/finetune_sjd2_hf.py"


def open_checkpoint(weights: str | None, name: str, family: str, config_key: str) -> tuple[Path, NoisePath, dict]:
    """(directory, noise path, noise_aware.json) of a real model's noise-aware checkpoint, read before
    the (large) base weights so that a wrong directory fails at once. SJD2's own fine-tuned weights
    were never released: the directory is one our recipe made (`RECIPE --model {family}`)."""
    recipe = f"`python {RECIPE} --model {family} --base <{family} checkpoint> --data <shards> --out <dir>`"
    if not weights:
        raise FileNotFoundError(
            f"model {name!r}: `{config_key}` is not set. SJD2 needs a noise-aware fine-tune of {family}, which the "
            f"SJD2 authors did not release; make one with {recipe} and set `{config_key}=<dir>`."
        )
    directory = Path(str(weights)).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(
            f"model {name!r}: noise-aware checkpoint directory {directory.absolute()} not found. Set "
            f"`{config_key}` to a directory made by {recipe}."
        )
    path, meta = load_sidecar(directory, f"model {name!r}", config_key, recipe)
    if meta.get("family") != family:
        raise ValueError(
            f"model {name!r}: {directory} is a noise-aware {meta.get('family')!r} checkpoint, not {family!r}; "
            f"set `{config_key}` to one made with --model {family}"
        )
    return directory, path, meta


def save_checkpoint(adapter: NoiseAwareInputs, directory: Path, tokenizer, family: str, meta: dict) -> None:
    """Write the checkpoint `open_checkpoint` reads: the model through transformers' `save_pretrained`
    (safetensors, the base model's key names, so the plain adapter's loader reads it), the
    tokenizer, and the noise path's sidecar with `family` and `meta` (base model, training settings)."""
    directory.mkdir(parents=True, exist_ok=True)
    adapter.model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    save_sidecar(adapter.noise_path, directory, {"family": family, **meta})


class NoiseAwareInputs:
    """Mixin for a CausalLMAdapter with a `noise_path`: put it first among the bases."""

    capabilities = frozenset({WINDOW, CUSTOM_MASK, EMBEDS})
    base_adapter: type  # the adapter class this one adds the capability to (for `wrap`)
    noise_path: NoisePath
    model: torch.nn.Module

    @classmethod
    def wrap(cls, adapter, noise_path: NoisePath):
        """This class around an already built adapter of its base class (same model, cache and
        layout), with `noise_path` moved to the model's device and dtype."""
        if not isinstance(adapter, cls.base_adapter):
            raise TypeError(f"{cls.__name__}.wrap needs a {cls.base_adapter.__name__}, got {type(adapter).__name__}")
        self = cls.__new__(cls)
        self.__dict__.update(adapter.__dict__)
        self.noise_path = noise_path
        self._check_noise_path()
        return self

    def _check_noise_path(self) -> None:
        table = self.model.get_input_embeddings().weight
        if self.noise_path.hidden_size != table.shape[1]:
            raise ValueError(
                f"model {self.name!r}: the noise-aware checkpoint's timestep embedding has width "
                f"{self.noise_path.hidden_size}, the model's embeddings {table.shape[1]}"
            )
        self.noise_path.to(device=table.device, dtype=table.dtype).eval()

    @property
    def noise_levels(self) -> int:
        return self.noise_path.n_levels

    @property
    def embed_dim(self) -> int:
        return self.noise_path.hidden_size

    def _clean(self, ids: torch.Tensor) -> torch.Tensor:
        return self.noise_path.clean(self.model.get_input_embeddings()(ids))

    def _run(self, ids: torch.Tensor, **kwargs):
        return self._run_embeds(self.noise_path.inputs(self._clean(ids), torch.zeros_like(ids)), **kwargs)

    @torch.no_grad()
    def embed(self, tokens: torch.Tensor, levels: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return self.noise_path.noisy(self._clean(tokens), levels, noise)

    @torch.no_grad()
    def forward_embeds(self, embeds: torch.Tensor, levels: torch.Tensor, start: Sequence[int]) -> Logits:
        cache, width = self._ragged(), embeds.shape[1]
        extra = self.bucket(width) - width  # compile=true: a width of the compiled set (slots after the window)
        if extra:
            embeds, levels = F.pad(embeds, (0, 0, 0, extra)), F.pad(levels, (0, extra))
        kwargs = cache.prepare(start, embeds.shape[1], self.device)
        if self._with_uncond:  # the unconditional rows get the same window inputs
            embeds, levels = torch.cat([embeds, embeds]), torch.cat([levels, levels])
        self._in_window = True
        try:
            out = self._run_embeds(self.noise_path.inputs(embeds, levels), cache=cache.cache, use_cache=True, **kwargs)
        finally:
            self._in_window = False
        return self._crop(self._split(out.logits), width)


class NoiseAwareLMInputs(NoiseAwareInputs):
    """For adapters whose `model` is a NoiseAwareLM: the module is both the path and the LM."""

    model: NoiseAwareLM

    @property
    def noise_path(self) -> NoisePath:
        return self.model

    def _run_embeds(self, inputs_embeds: torch.Tensor, **kwargs):
        return self._stack()(inputs_embeds=inputs_embeds, **kwargs)

    def window_stack(self) -> torch.nn.Module:
        return self.model.lm
