"""Shadow timing: a stand-in decides, a real architecture with random weights is timed.

A stand-in (sjd/standin/) is a small model calibrated so that decoders accept drafts as they do on the real model,
but its forwards cost what a small model costs. `ShadowedAdapter` is the stand-in as the decoders see it, with a
second adapter beside it, the shadow: a real architecture at real width (sjd/models/real_architectures.py). Every
call the decoder makes is made on both, with the same shapes, and the decoder decides on the stand-in's logits
alone; the shadow's outputs are computed (on a GPU that is the time being measured) and dropped. So the tokens
are the stand-in's, and the forwards a GPU times are the real model's.

What the shadow receives, call by call:
- `prefill`: the same prompts and CFG rows, encoded by the shadow's own prompt encoder, so its prompt is as long
  as the real model's;
- `forward`, `forward_at`, `keep_slots`, `truncate`: the same rows, widths, generated positions, keep masks,
  window masks and transient slots, the tokens mapped into the shadow's vocabulary (`token_table`);
- `forward_embeds` (SJD2's noisy inputs): a `forward` of the tokens the last `embed` was given, mapped (a real
  architecture has no noise-aware input path; the noise mix, a few element-wise operations, is not timed);
- `head`, `code_head` (a drafter's or draft heads' features through the LM head): the shadow's head on hidden
  states of its own width and dtype (zeros: the values do not change the cost).
Everything else is the stand-in's: layout and grammar, code embeddings, images, the weights a run hashes.

Generated positions are the stand-in's. The shadow's layout becomes the stand-in's layout over the shadow's own
vocabulary (`follow_layout`), so a cache sized by the layout (the static cache) holds the stand-in's positions.
A shadow follows a stand-in whose stream is no longer than the stream its real model generates (`fits`).

Timing. Each stand-in call (with the id mapping) runs inside the forward clock's `set_aside()`
(sjd.decoders.base.ForwardClock), so the latency columns hold the shadow's calls and the decoder's own work, and
the stand-in's seconds are reported apart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import torch

from sjd.models.base import ModelAdapter
from sjd.types import ImageLayout, Logits, Prompt


def distinct_forced(layout: ImageLayout) -> list[int]:
    """The ids the grammar forces, each once, in the order of the first position that forces it."""
    return list(dict.fromkeys(layout.forced[layout.forced >= 0].tolist()))


def token_table(standin: ImageLayout, shadow: ImageLayout) -> torch.Tensor:
    """[standin vocab] long: the shadow's id for each of the stand-in's. Image code i (the i-th free id) becomes the
    shadow's code i modulo its codebook; the k-th distinct forced id (begin- and end-of-image, size tokens,
    end-of-line) becomes the shadow's k-th distinct forced id modulo their number (a code where the shadow forces
    none, as LlamaGen); an id that is neither, which no decoder writes, becomes a code."""
    codes = shadow.free_token_ids
    table = codes[torch.arange(standin.vocab_size) % len(codes)]
    free = standin.free_token_ids
    table[free] = codes[torch.arange(len(free)) % len(codes)]
    ours = distinct_forced(standin)
    if ours:
        theirs = torch.tensor(distinct_forced(shadow) or codes.tolist(), dtype=torch.long)
        table[torch.tensor(ours)] = theirs[torch.arange(len(ours)) % len(theirs)]
    return table


def follow_layout(shadow: ImageLayout, standin: ImageLayout, table: torch.Tensor) -> ImageLayout:
    """The stand-in's stream (its generated positions, rows and forced positions, the forced ids mapped) over the
    shadow's vocabulary."""
    forced = torch.where(standin.forced >= 0, table[standin.forced.clamp(min=0)], -1)
    return ImageLayout(
        n_tokens=standin.n_tokens,
        height=standin.height,
        width=standin.width,
        row_stride=standin.row_stride,
        first_code=standin.first_code,
        forced=forced,
        free_tokens=shadow.free_tokens,
        vocab_size=shadow.vocab_size,
    )


def fits(standin: ImageLayout, shadow: ImageLayout) -> bool:
    """Whether the shadow's real model generates at least as many positions as the stand-in (LlamaGen's rotary
    table, for one, has no row past its own image)."""
    return standin.n_tokens <= shadow.n_tokens


class ShadowedAdapter(ModelAdapter):
    """The stand-in `standin` as a decoder sees it, every call also made on `shadow` (on the same device; the
    harness builds it, sjd/harness/shadow.py). `shadow` must fit the stand-in (`fits`). `record`: what a run
    records of the shadow (its architecture, parameters and depth)."""

    def __init__(self, standin: ModelAdapter, shadow: ModelAdapter, record: dict | None = None) -> None:
        if torch.device(shadow.device) != torch.device(standin.device):
            raise ValueError(f"the shadow is on {shadow.device}, the stand-in {standin.name!r} on {standin.device}")
        if not fits(standin.layout, shadow.layout):
            raise ValueError(
                f"the shadow generates {shadow.layout.n_tokens} positions, the stand-in {standin.name!r} "
                f"{standin.layout.n_tokens}"
            )
        self.standin, self.shadow, self.record = standin, shadow, dict(record or {})
        self.name, self.device, self.layout = standin.name, standin.device, standin.layout
        self.capabilities = standin.capabilities
        self.official_schedule = standin.official_schedule
        self.training_record = standin.training_record
        self.noise_levels, self.embed_dim = standin.noise_levels, standin.embed_dim
        table = token_table(standin.layout, shadow.layout)
        shadow.layout = follow_layout(shadow.layout, standin.layout, table)
        self.ids = table.to(standin.device)
        self._clock = None
        self._embedded: torch.Tensor | None = None  # the shadow's ids of the last `embed` (SJD2)
        self._hidden: dict[tuple[int, ...], torch.Tensor] = {}  # the shadow's head inputs, by shape

    # -- what is the stand-in's alone ---------------------------------------------------------------
    @property
    def cache_kind(self) -> str:
        return self.standin.cache_kind

    def networks(self) -> dict[str, torch.nn.Module]:
        """The stand-in's: the weights that decide the samples (the shadow's are seeded random ones)."""
        return self.standin.networks()

    def token_embeddings(self) -> torch.Tensor:
        return self.standin.token_embeddings()

    def architecture(self) -> dict:
        return self.standin.architecture()

    def code_embeddings(self) -> torch.Tensor:
        return self.standin.code_embeddings()

    def decode_images(self, tokens: torch.Tensor) -> np.ndarray:
        return self.standin.decode_images(tokens)

    # -- set-up, on both ------------------------------------------------------------------------------
    def timed_by(self, clock: object | None) -> None:
        self._clock = clock

    def check_prompts(self, prompts: Sequence[Prompt]) -> None:
        self.standin.check_prompts(prompts)
        self.shadow.check_prompts(prompts)

    def use_cache(self, kind: str) -> None:
        self.standin.use_cache(kind)
        self.shadow.use_cache(kind)

    def compile_windows(self, mode: str | None) -> None:
        """compile=true: both compile their window forward (the shadow's is the one timed)."""
        self.standin.compile_windows(mode)
        self.shadow.compile_windows(mode)

    def uncompile(self) -> None:
        self.standin.uncompile()
        self.shadow.uncompile()

    @property
    def compiled(self) -> bool:
        return self.standin.compiled

    # -- model calls: the stand-in's set aside, then the shadow's ------------------------------------
    def set_aside(self) -> contextlib.AbstractContextManager:
        """The context the stand-in's work runs in: the forward clock's `set_aside()` during a decode."""
        return self._clock.set_aside() if self._clock is not None else contextlib.nullcontext()

    def prefill(self, prompts: Sequence[Prompt], with_uncond: bool) -> Logits:
        with self.set_aside():
            out = self.standin.prefill(prompts, with_uncond)
        self.shadow.prefill(prompts, with_uncond)
        return out

    def forward(self, tokens: torch.Tensor, start: Sequence[int]) -> Logits:
        with self.set_aside():
            out = self.standin.forward(tokens, start)
            ids = self.ids[tokens]
        self.shadow.forward(ids, start)
        return out

    def forward_at(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        keep: torch.Tensor,
        window_mask: torch.Tensor,
        transient: torch.Tensor | None = None,
    ) -> Logits:
        with self.set_aside():
            out = self.standin.forward_at(tokens, positions, keep, window_mask, transient)
            ids = self.ids[tokens]
        self.shadow.forward_at(ids, positions, keep, window_mask, transient)
        return out

    def keep_slots(self, keep: torch.Tensor) -> None:
        with self.set_aside():
            self.standin.keep_slots(keep)
        self.shadow.keep_slots(keep)

    def truncate(self, lengths: Sequence[int]) -> None:
        with self.set_aside():
            self.standin.truncate(lengths)
        self.shadow.truncate(lengths)

    def embed(self, tokens: torch.Tensor, levels: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        with self.set_aside():
            out = self.standin.embed(tokens, levels, noise)
            self._embedded = self.ids[tokens]
        return out

    def forward_embeds(self, embeds: torch.Tensor, levels: torch.Tensor, start: Sequence[int]) -> Logits:
        with self.set_aside():
            out = self.standin.forward_embeds(embeds, levels, start)
            ids = self._embedded
            if ids is None or tuple(ids.shape) != tuple(embeds.shape[:2]):  # embeds that no `embed` made
                ids = self.ids.new_full(tuple(embeds.shape[:2]), int(self.shadow.layout.free_token_ids[0]))
        self.shadow.forward(ids, start)
        return out

    def head(self, hidden: torch.Tensor) -> Logits:
        with self.set_aside():
            out = self.standin.head(hidden)
            shadow_hidden = self._shadow_hidden(hidden)
        self.shadow.head(shadow_hidden)
        return out

    def code_head(self, hidden: torch.Tensor) -> Logits:
        with self.set_aside():
            out = self.standin.code_head(hidden)
            shadow_hidden = self._shadow_hidden(hidden)
        self.shadow.code_head(shadow_hidden)
        return out

    def _shadow_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """Zeros of `hidden`'s leading shape at the shadow's hidden size and dtype, made once per shape."""
        shape = tuple(hidden.shape[:-1])
        if shape not in self._hidden:
            width = int(self.shadow.architecture()["hidden_size"])
            self._hidden[shape] = torch.zeros(*shape, width, dtype=shadow_dtype(self.shadow), device=hidden.device)
        return self._hidden[shape]


def shadow_dtype(adapter: ModelAdapter) -> torch.dtype:
    """The dtype of an adapter's floating-point weights (a real architecture is built in one)."""
    for net in adapter.networks().values():
        for p in net.parameters():
            if p.is_floating_point():
                return p.dtype
    return torch.float32
