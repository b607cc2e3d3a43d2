"""Protocol plumbing shared by adapters whose model is a transformers causal LM over ids.

Subclasses provide the prompt ids (conditional rows, then unconditional rows for CFG, all of
one length), the layout and image decoding; this class runs prefill and windows through the
ragged cache and splits the CFG rows, so every such model is driven the same way.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import torch

from sjd.models.base import CUSTOM_MASK, WINDOW, Logits, ModelAdapter, Prompt
from sjd.models.ragged_cache import RaggedCache


class CausalLMAdapter(ModelAdapter):
    capabilities = frozenset({WINDOW, CUSTOM_MASK})
    model: torch.nn.Module

    @abstractmethod
    def prompt_ids(self, prompts: Sequence[Prompt], with_uncond: bool) -> torch.Tensor:
        """[B or 2B, T] ids: conditional rows, then (with CFG) unconditional rows."""

    @torch.no_grad()
    def prefill(self, prompts: Sequence[Prompt], with_uncond: bool) -> Logits:
        ids = self.prompt_ids(prompts, with_uncond).to(self.device)
        self._with_uncond = with_uncond
        self._cache = RaggedCache(self.model.config, [ids.shape[1]] * ids.shape[0], int(with_uncond))
        out = self._run(ids, cache=self._cache.cache, use_cache=True, logits_to_keep=1)
        return self._split(out.logits)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, start: Sequence[int]) -> Logits:
        kwargs = self._ragged().prepare(start, tokens.shape[1], self.device)
        ids = torch.cat([tokens, tokens]) if self._with_uncond else tokens
        out = self._run(ids, cache=self._ragged().cache, use_cache=True, **kwargs)
        return self._split(out.logits)

    def _run(self, ids: torch.Tensor, **kwargs):
        """One model call on ids; adapters whose model takes embeddings override this."""
        return self.model(input_ids=ids, **kwargs)

    @torch.no_grad()
    def forward_at(
        self, tokens: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor, window_mask: torch.Tensor
    ) -> Logits:
        kwargs = self._ragged().prepare_at(positions.cpu(), keep.cpu(), window_mask.cpu(), self.device)
        ids = torch.cat([tokens, tokens]) if self._with_uncond else tokens
        out = self._run(ids, cache=self._ragged().cache, use_cache=True, **kwargs)
        return self._split(out.logits)

    def truncate(self, lengths: Sequence[int]) -> None:
        self._ragged().truncate(lengths)

    def _ragged(self) -> RaggedCache:
        cache = getattr(self, "_cache", None)
        if cache is None:
            raise RuntimeError(f"{self.name}: call prefill before forward or truncate")
        return cache

    def _split(self, logits: torch.Tensor) -> Logits:
        logits = logits.float()
        if not self._with_uncond:
            return Logits(logits, None)
        cond, uncond = logits.chunk(2)
        return Logits(cond, uncond)
