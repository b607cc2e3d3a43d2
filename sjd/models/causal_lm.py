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
from dataclasses import dataclass

import torch

from sjd.models.base import ModelAdapter
from sjd.models.cache import RaggedCache
from sjd.types import CUSTOM_MASK, FEATURES, WINDOW, Features, Logits, Prompt


@dataclass
class RunOutput:
    """One model call: raw logits [rows, W or kept, V] and the hidden states after the final norm [rows, W, H]."""

    logits: torch.Tensor
    hidden: torch.Tensor | None = None


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

    def keep_slots(self, keep: torch.Tensor) -> None:
        self._ragged().keep_slots(keep)

    def _split(self, logits: torch.Tensor) -> Logits:
        """[2B or B, W, V] -> conditional and unconditional rows, in float32 for the logits pipeline."""
        logits = logits.float()
        if not self._with_uncond:
            return Logits(logits, None)
        cond, uncond = logits.chunk(2)
        return Logits(cond, uncond)

    def _output(self, out, ids: torch.Tensor | None = None, lengths: Sequence[int] | None = None) -> Logits:
        """A model call's logits split into CFG rows, with its hidden states attached where the call kept
        them (the `features` capability); a prefill also records the prompt `ids` and row `lengths`."""
        logits = self._split(out.logits)
        hidden = getattr(out, "hidden", None)
        if hidden is not None:
            logits.features = Features(hidden, ids, None if lengths is None else list(lengths))
        return logits


class CausalLMAdapter(RaggedRows, ModelAdapter):
    """A transformers causal LM whose `model.model` is the decoder stack (its `last_hidden_state` is after
    the final norm) and `model.lm_head` the head; an adapter whose model differs overrides `_run`,
    `_run_embeds`, `lm_head` and `token_embeddings`."""

    capabilities = frozenset({WINDOW, CUSTOM_MASK, FEATURES})
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
        return self._output(out, ids, lengths)

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
        return self._output(out)

    def _run(self, ids: torch.Tensor, logits_to_keep: int = 0, **kwargs) -> RunOutput:
        """One model call on ids: the decoder stack, then the LM head (on the last `logits_to_keep` slots
        when set), as the library's own forward computes it, with the hidden states kept."""
        return self._head_output(self.model.model(input_ids=ids, **kwargs).last_hidden_state, logits_to_keep)

    def _run_embeds(self, inputs_embeds: torch.Tensor, logits_to_keep: int = 0, **kwargs) -> RunOutput:
        """One model call on input embeddings [rows, W, D] (the noise-aware path of SJD2)."""
        hidden = self.model.model(inputs_embeds=inputs_embeds, **kwargs).last_hidden_state
        return self._head_output(hidden, logits_to_keep)

    def _head_output(self, hidden: torch.Tensor, logits_to_keep: int) -> RunOutput:
        kept = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        return RunOutput(self.lm_head(kept), hidden)

    # -- the `features` capability ------------------------------------------------------------------
    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.lm_head

    @torch.no_grad()
    def head(self, hidden: torch.Tensor) -> Logits:
        return self._split(self.lm_head(hidden.to(self.lm_head.weight.dtype)))

    def token_embeddings(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def architecture(self) -> dict:
        config = self.model.config
        config = getattr(config, "text_config", None) or config  # a composite config's language model
        arch = config.to_dict()
        arch["rope_theta"] = rope_theta(config)
        return arch

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
        return self._output(out)


def rope_theta(config) -> float:
    """The rotary base of a transformers config (5.x keeps it under `rope_parameters`)."""
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", 10000.0))
