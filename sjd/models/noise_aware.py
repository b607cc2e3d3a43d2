"""The `embeds` capability for adapters whose model is a `NoiseAwareLM` (SJD2, sjd/toy/noise_aware.py).

Every model call goes through the noise-aware input path (unit-RMS embeddings plus the
timestep embedding), clean tokens at level 0, so AR, SJD and SJD2 all decode the same model
and compare fairly. SJD2's window inputs come in as noisy embeddings; the noise schedule stays
with the model that was trained on it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sjd.models.base import CUSTOM_MASK, EMBEDS, WINDOW, Logits
from sjd.toy.noise_aware import N_LEVELS, NoiseAwareLM


class NoiseAwareInputs:
    """Mixin for a CausalLMAdapter whose `model` is a NoiseAwareLM."""

    capabilities = frozenset({WINDOW, CUSTOM_MASK, EMBEDS})
    noise_levels = N_LEVELS
    model: NoiseAwareLM

    @property
    def embed_dim(self) -> int:
        return self.model.config.hidden_size

    def _run(self, ids: torch.Tensor, **kwargs):
        return self.model(self.model.clean_embeddings(ids), torch.zeros_like(ids), **kwargs)

    @torch.no_grad()
    def embed(self, tokens: torch.Tensor, levels: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return self.model.noisy(self.model.clean_embeddings(tokens), levels, noise)

    @torch.no_grad()
    def forward_embeds(self, embeds: torch.Tensor, levels: torch.Tensor, start: Sequence[int]) -> Logits:
        cache = self._ragged()
        kwargs = cache.prepare(start, embeds.shape[1], self.device)
        if self._with_uncond:  # the unconditional rows get the same window inputs
            embeds, levels = torch.cat([embeds, embeds]), torch.cat([levels, levels])
        out = self.model(embeds, levels, cache=cache.cache, use_cache=True, **kwargs)
        return self._split(out.logits)
