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

import contextlib
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from sjd.models.base import ModelAdapter
from sjd.models.cache import RaggedCache
from sjd.models.static_cache import KVStorage, StaticRowCache
from sjd.types import CUSTOM_MASK, FEATURES, WINDOW, Features, Logits, Prompt


@dataclass
class RunOutput:
    """One model call: raw logits [rows, W or kept, V] and the hidden states after the final norm [rows, W, H]."""

    logits: torch.Tensor
    hidden: torch.Tensor | None = None


CACHES = ("dynamic", "static")
PROMPT_ROUNDING = 64  # compiled: the static cache's prompt region is a multiple of this many slots
RECOMPILE_LIMIT = 256  # compiled window shapes a process may hold: batch sizes x power-of-two widths, and more


def compile_options(mode: str | None, backend: str | None) -> dict:
    """torch.compile's keywords: inductor with `mode`, or another `backend` (which takes no mode)."""
    return {"mode": mode} if backend in (None, "inductor") else {"backend": backend}


def uses_cuda_graphs(mode: str | None) -> bool:
    """Whether torch.compile's `mode` replays CUDA graphs (on a CUDA device), whose outputs the next replay reuses."""
    return mode in ("reduce-overhead", "max-autotune")


class KeptOutputs(torch.nn.Module):
    """A compiled module whose tensor outputs are cloned on the way out: under CUDA graph trees a replay's outputs
    live in the graphs' memory pool and the next replay overwrites them, while decoders keep a window's logits and
    features past the next forward (a drafter's features, carried draft distributions). Hooks on this module run
    outside the graph, as on the compiled module."""

    def __init__(self, compiled: torch.nn.Module) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, *args, **kwargs):
        return torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, self.compiled(*args, **kwargs))


class RaggedRows:
    """What an adapter on a per-row cache shares: the cache's kind, truncation, the cache guard and the CFG row
    split. The adapter builds `self._cache` in prefill (`new_cache`) and sets `self._with_uncond`.

    `cache_kind`: `dynamic`, a transformers DynamicCache with the bookkeeping on the host (sjd/models/cache.py),
    or `static`, one preallocated tensor per layer with the bookkeeping on the device
    (sjd/models/static_cache.py), which a compiled forward needs. Both give the same logits."""

    name: str
    device: torch.device
    layout: object
    _with_uncond: bool
    cache_kind: str = "dynamic"

    def use_cache(self, kind: str) -> None:
        """Decode with this kind of KV cache from the next prefill on."""
        if kind not in CACHES:
            raise ValueError(f"cache must be one of {CACHES}, got {kind!r}")
        self.cache_kind = kind

    # -- compile=true ---------------------------------------------------------------------------------
    _compiled: torch.nn.Module | None = None  # the compiled window stack (compile_windows), None when eager
    _in_window = False  # set while a window (not the prefill) goes through the stack
    _padded_widths: frozenset[int] = frozenset()  # compiled: the widths this decode call's windows were padded to
    prompt_rounding = PROMPT_ROUNDING  # compiled: the static cache's prompt region, a multiple of this

    def window_stack(self) -> torch.nn.Module:
        """The network a window goes through (what compile=true compiles)."""
        raise NotImplementedError(f"model {self.name!r} cannot compile its windows")

    def compile_windows(self, mode: str | None, backend: str | None = None) -> None:
        """Compile the window forward (torch.compile, `mode` as torch takes it) on the static cache, into one graph
        (`fullgraph`: a graph break is an error, not a silent split). Window widths are padded up to a power of two,
        or to a wider width the same decode call already forwards (`bucket`), so each width compiles once and
        nothing recompiles per iteration; the prefill stays eager (its width is the prompt's). Under CUDA graphs
        (`reduce-overhead`), a replay writes its outputs into memory the next replay overwrites, so the window's
        outputs are cloned as they leave the graph (`KeptOutputs`). `backend`: torch.compile's backend (None:
        inductor, with `mode`; `eager` traces and checks the same graphs without generating code, as the device
        check's tiny run does on the CPU)."""
        self.use_cache("static")
        # One graph per (batch rows, bucket) pair: more than dynamo's default of 8 recompiles of one frame, after
        # which it would quietly run the rest eagerly.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        compiled = torch.compile(self.window_stack(), dynamic=False, fullgraph=True, **compile_options(mode, backend))
        self._compiled = KeptOutputs(compiled) if uses_cuda_graphs(mode) else compiled

    def uncompile(self) -> None:
        """Back to the eager window forward (the cache stays as it is)."""
        self._compiled = None

    @contextlib.contextmanager
    def eagerly(self) -> Iterator[None]:
        """Windows go through the eager stack inside the block, on the same cache, and through the same compiled
        stack after it: a bench writes a long context in wide chunks without compiling a graph for each chunk."""
        compiled, self._compiled = self._compiled, None
        try:
            yield
        finally:
            self._compiled = compiled

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    def _stack(self) -> torch.nn.Module:
        return self._compiled if self._compiled is not None and self._in_window else self.window_stack()

    def bucket(self, width: int) -> int:
        """The width a window is padded to: itself when eager. Compiled: the narrowest width this decode call has
        already padded to that holds it, else the next power of two. So the narrower windows at the end of an
        image (the last tokens of a Jacobi window, a shrinking tree) reuse the call's own widest graph instead of
        compiling one graph per power of two below it, and no window is padded wider than one the same call
        already forwards (AR's one-token steps stay one token wide). Each call starts afresh (`new_cache`): a
        decoder's windows never pad to another decoder's widths."""
        if self._compiled is None:
            return width
        held = [w for w in self._padded_widths if w >= width]
        if held:
            return min(held)
        padded = 1 << max(width - 1, 0).bit_length()
        self._padded_widths = self._padded_widths | {padded}
        return padded

    @staticmethod
    def _crop(logits: Logits, width: int) -> Logits:
        """The first `width` outputs of a padded window."""
        if logits.cond.shape[1] == width:
            return logits
        out = Logits(logits.cond[:, :width], None if logits.uncond is None else logits.uncond[:, :width])
        if logits.features is not None:
            f = logits.features
            out.features = Features(f.hidden[:, :width], f.ids, f.lengths)
        return out

    def new_cache(self, config, prompt_lengths: Sequence[int], uncond_copies: int) -> RaggedCache | StaticRowCache:
        self._padded_widths = frozenset()  # a new decode call: its windows pad only to widths it forwards (`bucket`)
        if self.cache_kind == "static":
            # compiled: the prompt region rounded up, so that a prompt of another length compiles no new graph
            step = self.prompt_rounding
            slots = -(-max(prompt_lengths) // step) * step if self.compiled else None
            return StaticRowCache(
                prompt_lengths, uncond_copies, self.layout.n_tokens, self.device, prompt_slots=slots,
                storage=self.kv_storage,
            )  # fmt: skip
        return RaggedCache(config, prompt_lengths, uncond_copies)

    @property
    def kv_storage(self) -> KVStorage:
        """The static cache's keys and values, allocated once and reused by every prompt (sjd.models.static_cache)."""
        if getattr(self, "_kv_storage", None) is None:
            self._kv_storage = KVStorage()
        return self._kv_storage

    def truncate(self, lengths: Sequence[int]) -> None:
        self._ragged().truncate(lengths)

    def _ragged(self) -> RaggedCache | StaticRowCache:
        cache = getattr(self, "_cache", None)
        if cache is None:
            raise RuntimeError(f"{self.name}: call prefill before forward or truncate")
        return cache

    def _window_at(
        self, positions: torch.Tensor, keep: torch.Tensor, window_mask: torch.Tensor, transient: torch.Tensor | None
    ) -> dict:
        """The model kwargs of a `forward_at` window (the dynamic cache's bookkeeping lives on the host, the
        static cache's on the device)."""
        cache = self._ragged()
        if isinstance(cache, StaticRowCache):
            return cache.prepare_at(positions, keep, window_mask, self.device, transient)
        transient = None if transient is None else transient.cpu()
        return cache.prepare_at(positions.cpu(), keep.cpu(), window_mask.cpu(), self.device, transient)

    def keep_slots(self, keep: torch.Tensor) -> None:
        padding = self.bucket(keep.shape[1]) - keep.shape[1]  # the last window was padded as wide (compile=true)
        self._ragged().keep_slots(torch.nn.functional.pad(keep, (0, padding)) if padding else keep)

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
        self._cache = self.new_cache(self.model.config, lengths, int(with_uncond))
        kwargs = self._cache.prefill_kwargs(self.device)
        out = self._run(ids, cache=self._cache.cache, use_cache=True, logits_to_keep=1, **kwargs)
        return self._output(out, ids, lengths)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, start: Sequence[int]) -> Logits:
        width = tokens.shape[1]
        tokens = pad_window(tokens, self.bucket(width))  # the padding writes positions the next window drops
        kwargs = self._ragged().prepare(start, tokens.shape[1], self.device)
        ids = torch.cat([tokens, tokens]) if self._with_uncond else tokens
        out = self._window_run(ids, cache=self._ragged().cache, use_cache=True, **kwargs)
        return self._crop(self._output(out), width)

    def _window_run(self, ids: torch.Tensor, **kwargs) -> RunOutput:
        """`_run` for a window: through the compiled stack when there is one."""
        self._in_window = True
        try:
            return self._run(ids, **kwargs)
        finally:
            self._in_window = False

    def _run(self, ids: torch.Tensor, logits_to_keep: int = 0, **kwargs) -> RunOutput:
        """One model call on ids: the decoder stack, then the LM head (on the last `logits_to_keep` slots
        when set), as the library's own forward computes it, with the hidden states kept."""
        return self._head_output(self._stack()(input_ids=ids, **kwargs).last_hidden_state, logits_to_keep)

    def _run_embeds(self, inputs_embeds: torch.Tensor, logits_to_keep: int = 0, **kwargs) -> RunOutput:
        """One model call on input embeddings [rows, W, D] (the noise-aware path of SJD2)."""
        hidden = self._stack()(inputs_embeds=inputs_embeds, **kwargs).last_hidden_state
        return self._head_output(hidden, logits_to_keep)

    def window_stack(self) -> torch.nn.Module:
        return self.model.model

    def _head_output(self, hidden: torch.Tensor, logits_to_keep: int) -> RunOutput:
        """The LM head on the kept slots. A compiled window computes the image codes' rows only (`code_logits`):
        what decoding reads, at 1/8 of Chameleon's head; the eager engine computes every row, as published code
        does."""
        kept = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
        if self._in_window and self.compiled:
            return RunOutput(self.code_logits(kept), hidden)
        return RunOutput(self.lm_head(kept), hidden)

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Raw logits [rows, W, V] with the image codes' columns computed and the others 0, which the shared
        pipeline never reads (it reads the free columns at a code's position and forces every other one)."""
        head = self.lm_head
        cols = self.layout.free_columns(hidden.device)  # one id range on every real model: a view, no copy
        if isinstance(cols, slice) and cols.stop - cols.start == head.weight.shape[0]:
            return head(hidden)  # the head is all codes (nothing to cut)
        bias = None if head.bias is None else head.bias[cols]
        codes = torch.nn.functional.linear(hidden.to(head.weight.dtype), head.weight[cols], bias)
        out = codes.new_zeros(*codes.shape[:-1], head.weight.shape[0])
        out[..., cols] = codes
        return out

    # -- the `features` capability ------------------------------------------------------------------
    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.lm_head

    @torch.no_grad()
    def head(self, hidden: torch.Tensor) -> Logits:
        return self._split(self.lm_head(hidden.to(self.lm_head.weight.dtype)))

    @torch.no_grad()
    def code_head(self, hidden: torch.Tensor) -> Logits:
        return self._split(self.code_logits(hidden))

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
        width = tokens.shape[1]
        tokens, positions, window_mask, transient = pad_tree(
            tokens, positions, window_mask, transient, self.bucket(width)
        )
        kwargs = self._window_at(positions, keep, window_mask, transient)
        ids = torch.cat([tokens, tokens]) if self._with_uncond else tokens
        out = self._window_run(ids, cache=self._ragged().cache, use_cache=True, **kwargs)
        return self._crop(self._output(out), width)


def rope_theta(config) -> float:
    """The rotary base of a transformers config (5.x keeps it under `rope_parameters`)."""
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", 10000.0))


def pad_window(tokens: torch.Tensor, width: int) -> torch.Tensor:
    """[B, W] -> [B, width]: the last token repeated (slots after the window, which no real query sees)."""
    extra = width - tokens.shape[1]
    return tokens if extra <= 0 else torch.cat([tokens, tokens[:, -1:].expand(-1, extra)], dim=1)


def pad_tree(
    tokens: torch.Tensor,
    positions: torch.Tensor,
    window_mask: torch.Tensor,
    transient: torch.Tensor | None,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A `forward_at` window padded to `width` with padding slots (position -1, seen by nothing but themselves)."""
    extra = width - tokens.shape[1]
    if extra <= 0:
        return tokens, positions, window_mask, transient
    pad = torch.nn.functional.pad
    tokens = pad(tokens, (0, extra))
    positions = pad(positions, (0, extra), value=-1)
    window_mask = pad(window_mask, (0, extra, 0, extra))
    transient = None if transient is None else pad(transient, (0, extra))
    return tokens, positions, window_mask, transient
