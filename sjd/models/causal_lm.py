"""Protocol plumbing shared by adapters whose model is a transformers causal LM over ids.

Subclasses provide the prompt ids (conditional rows, then unconditional rows for CFG), the
layout and image decoding; this class runs prefill and windows through the ragged cache and
splits the CFG rows, so every such model is driven the same way. Rows of one length come from
`prompt_ids`; an adapter whose rows differ in length (e.g. a real negative prompt) overrides
`prompt_batch` to return left-padded ids plus each row's length, and the pad slots become
holes of the ragged cache, never attended to, with positions counted from each row's first
real token.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import torch

from sjd.models.base import ModelAdapter
from sjd.models.cache import RaggedCache
from sjd.types import CUSTOM_MASK, WINDOW, Logits, Prompt


class RaggedRows:
    """What an adapter on a RaggedCache shares: truncation, the cache guard and the CFG row split.
    The adapter sets `self._cache` (a RaggedCache) in prefill and `self._with_uncond`."""

    name: str
    device: torch.device
    _with_uncond: bool

    def truncate(self, lengths: Sequence[int]) -> None:
        self._ragged().truncate(lengths)

    def _ragged(self) -> RaggedCache:
        cache = getattr(self, "_cache", None)
        if cache is None:
            raise RuntimeError(f"{self.name}: call prefill before forward or truncate")
        return cache

    def _window_at(
        self, positions: torch.Tensor, keep: torch.Tensor, window_mask: torch.Tensor, transient: torch.Tensor | None
    ) -> dict:
        """The model kwargs of a `forward_at` window (the cache's bookkeeping lives on the host)."""
        transient = None if transient is None else transient.cpu()
        return self._ragged().prepare_at(positions.cpu(), keep.cpu(), window_mask.cpu(), self.device, transient)

    def _split(self, logits: torch.Tensor) -> Logits:
        """[2B or B, W, V] -> conditional and unconditional rows, in float32 for the logits pipeline."""
        logits = logits.float()
        if not self._with_uncond:
            return Logits(logits, None)
        cond, uncond = logits.chunk(2)
        return Logits(cond, uncond)


class CausalLMAdapter(RaggedRows, ModelAdapter):
    capabilities = frozenset({WINDOW, CUSTOM_MASK})
    model: torch.nn.Module

    @abstractmethod
    def prompt_ids(self, prompts: Sequence[Prompt], with_uncond: bool) -> torch.Tensor:
        """[B or 2B, T] ids: conditional rows, then (with CFG) unconditional rows."""

    def prompt_batch(self, prompts: Sequence[Prompt], with_uncond: bool) -> tuple[torch.Tensor, list[int]]:
        """Left-padded ids [rows, T] and each row's prompt length. By default every row of
        `prompt_ids` is a full-length prompt."""
        ids = self.prompt_ids(prompts, with_uncond)
        return ids, [ids.shape[1]] * ids.shape[0]

    @torch.no_grad()
    def prefill(self, prompts: Sequence[Prompt], with_uncond: bool) -> Logits:
        ids, lengths = self.prompt_batch(prompts, with_uncond)
        ids = ids.to(self.device)
        self._with_uncond = with_uncond
        self._cache = RaggedCache(self.model.config, lengths, int(with_uncond))
        kwargs = {} if self._cache.uniform_prompt else self._padded_prompt_kwargs()
        out = self._run(ids, cache=self._cache.cache, use_cache=True, logits_to_keep=1, **kwargs)
        return self._split(out.logits)

    def _padded_prompt_kwargs(self) -> dict:
        """Positions and mask for a left-padded prompt: each row's real tokens sit at 0..len-1
        and attend causally to each other only. A pad query attends to itself alone, so no
        softmax row is empty (no NaN reaches the cached keys and values)."""
        pos = self._cache.slot_pos  # [rows, T], -1 at the left padding
        mask = (pos >= 0)[:, None, :] & (pos[:, None, :] <= pos[:, :, None])
        mask |= torch.eye(pos.shape[1], dtype=torch.bool)
        return {"position_ids": pos.clamp(min=0).to(self.device), "attention_mask": mask[:, None].to(self.device)}

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, start: Sequence[int]) -> Logits:
        kwargs = self._ragged().prepare(start, tokens.shape[1], self.device)
        ids = torch.cat([tokens, tokens]) if self._with_uncond else tokens
        out = self._run(ids, cache=self._ragged().cache, use_cache=True, **kwargs)
        return self._split(out.logits)

    def _run(self, ids: torch.Tensor, **kwargs):
        """One model call on ids; adapters whose model takes embeddings override this."""
        return self.model(input_ids=ids, **kwargs)

    def _run_embeds(self, inputs_embeds: torch.Tensor, **kwargs):
        """One model call on input embeddings [rows, W, D] (the noise-aware path of SJD2)."""
        return self.model(inputs_embeds=inputs_embeds, **kwargs)

    @torch.no_grad()
    def forward_at(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        keep: torch.Tensor,
        window_mask: torch.Tensor,
        transient: torch.Tensor | None = None,
    ) -> Logits:
        kwargs = self._window_at(positions, keep, window_mask, transient)
        ids = torch.cat([tokens, tokens]) if self._with_uncond else tokens
        out = self._run(ids, cache=self._ragged().cache, use_cache=True, **kwargs)
        return self._split(out.logits)
