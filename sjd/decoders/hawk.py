"""Hawk (arXiv 2510.25739) as far as the paper states it: horizontal and vertical draft heads, a cache of vertical
speculations, a 2-D candidate pool per position, tree verification (docs/algorithms.md §12.10).

After every commit one heads call on the feature that predicted the last committed token draws a fresh draft at each
of the heads' offsets. The horizontal heads' drafts (offsets 1 .. `horizontal`) are the chain the next forward
verifies, and only they: no Jacobi draft is carried past the heads' reach. The vertical heads' drafts (offsets of a
whole number of rows) land a row or more ahead; they wait in a per-row cache of speculations, and when the chain
reaches their position they join the pool there as siblings of the chain draft, each with the q it was drawn from.
A sibling is a leaf slot that sees the chain before it (SJD-PAC's tree, sjd.decoders.sjd_pac).

Verification is recursive rejection sampling at the chain's first rejection, over siblings each drawn on its own
(sjd.core.verify.recursive_rejection, each with its own q): a vertical speculation was drawn from its head's q long
before, independently of the chain draft at its position, of the other speculations and of every coin, and whether
it is in the pool depends on the commit history only, never on its value. So each stage is speculative sampling of
a fresh draft and the decoder is exact, as Hawk says of its own; the micro-model audit and the one-sample audit hold
it to that.

Our choices where the paper leaves the detail open, each a setting: `horizontal` heads (4) and `vertical` depths
(2, the rows below), at most `branches - 1` speculations a position (the nearest row's first), the pool at the
chain's first `branch_depth` positions, and `window` the forward's whole width (lead-in, chain and siblings).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import torch

from sjd.decoders.headed import HeadsContinuation
from sjd.decoders.sjd_pac import SJDPACDecoder, TreeState
from sjd.decoders.window import WindowCall
from sjd.decoders.window_state import Redraft
from sjd.drafters.heads import HEADS_KEY, DraftHeads, load_heads
from sjd.models.base import ModelAdapter
from sjd.types import FEATURES, ImageLayout


@dataclass
class HawkState(TreeState):
    """The tree decoder's row state and each row's cached speculations: generated position -> the (offset, draft,
    q) drawn for it, the smallest offset (the latest heads call's) first."""

    speculations: list[dict[int, list[tuple[int, torch.Tensor, torch.Tensor]]]] = field(default_factory=list)


@dataclass(eq=False, kw_only=True)
class SpeculationPool:
    """Part before a tree decoder on SJD-PAC (sjd.decoders.sjd_pac) with draft heads (sjd.decoders.headed): head
    drafts wait in a per-row cache with the q each was drawn from, and when the chain reaches their position they
    are its siblings there, each verified with its own q (recursive rejection, `tree_tests` with `sibling_q`).
    Hawk caches its vertical heads' drafts; sjd.decoders.head_siblings caches every head's."""

    def new_state(self, B: int, layout: ImageLayout, device: torch.device) -> HawkState:
        state = super().new_state(B, layout, device)
        return HawkState(**vars(state), speculations=[{} for _ in range(B)])

    @property
    def siblings_from_q(self) -> bool:
        return False  # the siblings are cached speculations, counted on the host (`sibling_room`)

    def speculates_at(self, layout: ImageLayout, position: int) -> bool:
        """Whether a head draft for `position` joins the cache (a rule on positions only, never on drafts)."""
        return True

    def cache_speculations(
        self, state: HawkState, call: WindowCall, redraft: Redraft, offsets: Collection[int]
    ) -> None:
        """Drop the speculations each row's commit has passed; cache the heads call's drafts at `offsets` (those
        the decoder speculates with), each at its position with its q."""
        heads, N = self.load(call.adapter).offsets, call.layout.n_tokens
        kept = [k for k, d in enumerate(heads) if d in offsets]
        for b, n in enumerate(state.committed):
            cache = state.speculations[b]
            for passed in [m for m in cache if m < n]:
                del cache[passed]
            for k in kept:
                m = n - 1 + int(heads[k])  # the feature predicts n - 1
                if m < N and self.speculates_at(call.layout, m):
                    cache.setdefault(m, []).append((int(heads[k]), redraft.drafts[b, k], redraft.q[b, k]))
                    cache[m].sort(key=lambda entry: entry[0])

    def sibling_room(self, state: HawkState) -> list[list[tuple[bool, int]]]:
        """Per row, at its first `branch_depth` chain positions: how many speculations wait there (host-side)."""
        out = []
        for n, cache in zip(state.committed, state.speculations):
            out.append([(True, len(cache.get(n + k, ()))) for k in range(self.branch_depth)])
        return out

    def row_siblings(
        self,
        state: HawkState,
        b: int,
        d: torch.Tensor,
        dq: torch.Tensor,
        counts: list[int],
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The speculations cached at the chain's first positions, each with its own q."""
        device, K1 = state.tokens.device, self.branches - 1
        sib = torch.zeros(len(counts), K1, dtype=torch.long, device=device)
        sib_q = torch.zeros(len(counts), K1, dq.shape[-1], device=device)
        n = state.committed[b]
        for k, count in enumerate(counts):
            for i, (_, draft, q) in enumerate(state.speculations[b].get(n + k, [])[:count]):
                sib[k, i], sib_q[k, i] = draft, q
        return sib, sib_q


@dataclass(eq=False, kw_only=True)
class HawkDecoder(SpeculationPool, HeadsContinuation, SJDPACDecoder):
    requires = SJDPACDecoder.requires | {FEATURES}

    name: str = "hawk"
    window: int = 13  # a lead-in of up to 2, 4 horizontal drafts, 2 speculations at each of them (fewer fit first)
    horizontal: int = 4
    vertical: int = 2
    branches: int = 3
    branch_depth: int = 4
    coupling: str = "none"
    init: str = "random"  # fresh drafts only where the heads reach past the image end: none in practice
    replace: str = field(default="all", init=False)

    def __post_init__(self) -> None:
        if self.horizontal < 1 or self.vertical < 0:
            raise ValueError(
                f"decoder.horizontal must be >= 1 and decoder.vertical >= 0, got {self.horizontal}, {self.vertical}"
            )
        super().__post_init__()

    def config(self) -> dict:
        return {**super().config(), "horizontal": self.horizontal, "vertical": self.vertical}

    # -- the heads -------------------------------------------------------------------------------------
    def vertical_offsets(self, layout: ImageLayout) -> tuple[int, ...]:
        """One to `vertical` rows below; on rows shorter than the chain, a row below within its reach is a chain
        draft already, not a speculation."""
        below = (layout.row_stride * d for d in range(1, self.vertical + 1))
        return tuple(d for d in below if d > self.horizontal)

    def needed_offsets(self, layout: ImageLayout) -> tuple[int, ...]:
        return tuple(range(1, self.horizontal + 1)) + self.vertical_offsets(layout)

    def load(self, adapter: ModelAdapter) -> DraftHeads:
        return load_heads(adapter, self.heads["weights"], self.needed_offsets(adapter.layout))

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        have = self.load(adapter).offsets
        missing = [d for d in self.needed_offsets(adapter.layout) if d not in have]
        if missing:
            raise ValueError(
                f"decoder {self.name!r} (horizontal={self.horizontal}, vertical={self.vertical}) needs heads at "
                f"offsets {missing} on {adapter.name!r} (the row stride is {adapter.layout.row_stride}); "
                f"`{HEADS_KEY}`={self.heads['weights']} has {list(have)}: train them with `python "
                f"scripts/train_heads.py model={adapter.name} heads.horizontal={self.horizontal} "
                f"heads.vertical={self.vertical}`"
            )

    # -- drafts ----------------------------------------------------------------------------------------
    def adopt(self, state: HawkState, call: WindowCall, redraft: Redraft) -> None:
        """The horizontal drafts replace the chain (HeadsContinuation.adopt); the vertical ones wait in the cache."""
        super().adopt(state, call, redraft)
        self.cache_speculations(state, call, redraft, self.vertical_offsets(call.layout))

    def chain_plan(
        self, state: HawkState, b: int, lead: int, width: int, layout: ImageLayout, room: list[tuple[bool, int]]
    ) -> tuple[int, list[int]]:
        """The chain is the horizontal heads' reach; siblings take what the window leaves, nearest position first."""
        n, N = state.committed[b], layout.n_tokens
        budget = max(width - lead, 0) if width else 0
        n_chain = min(self.horizontal, budget, N - n)
        left, counts = budget - n_chain, []
        for k in range(min(self.branch_depth, n_chain)):
            count = min(self.branches - 1, room[k][1], left)
            counts.append(count)
            left -= count
        while counts and counts[-1] == 0:
            counts.pop()
        return n_chain, counts
