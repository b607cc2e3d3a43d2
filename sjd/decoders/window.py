"""The window family's one loop: SJD and its coupled, relaxed, Jacobi and drafter variants, SJD-PAC and SJD2.

Every window decoder runs the `generate` below: per iteration, the window rule gives each row its width, then
four phases, each timed as its stage (sjd.decoders.stages):

    draft    the window's inputs, the drafts it verifies and their q
    forward  one forward of the window against the cache, and p through the shared logits pipeline
    verify   the acceptance rule, and the drafts the slots carry into the next iteration
    commit   the accepted tokens into the row, the carried drafts, and `after_commit`

Each phase takes one `WindowStep` and writes what the phases after it read. A decoder changes the loop only
by replacing phases or the hooks they call (`begin`, `accept`, `next_drafts`, `after_commit`, `draw_redraft`). The
settings every window decoder shares are `WindowSettings`; a decoder's class lists only its own.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sjd.core.sampling import SamplingConfig
from sjd.core.schedule import OFFICIAL_L, WindowSchedule, check_official_l, check_schedule, make_schedule
from sjd.core.verify import VerifyResult
from sjd.decoders.base import DecodeCall, Decoder, DecodeResult, ForwardClock
from sjd.decoders.window_state import Redraft, WindowState, room_rows
from sjd.models.base import ModelAdapter
from sjd.types import ImageLayout, Logits, Prompt


@dataclass(eq=False, kw_only=True)
class WindowSettings:
    """The settings every window decoder takes (docs/algorithms.md §4; conf/decoder/sjd.yaml explains them).

    - `window`: forward inputs per iteration, so at most `window` tokens commit per forward;
    - `ar_prefix`, `ar_suffix`: generated positions decoded one token a forward (the `harness` rule);
    - `schedule`, `official_l`: the window rule (sjd.core.schedule);
    - `forced_drafts`: grammar-forced positions get the forced token as their draft."""

    window: int = 16
    ar_prefix: int = 1
    ar_suffix: int = 0
    forced_drafts: bool = True
    schedule: str = "harness"
    official_l: int = OFFICIAL_L

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"decoder.window must be >= 1, got {self.window}")
        if self.ar_prefix < 1 or self.ar_suffix < 0:
            raise ValueError(
                f"decoder.ar_prefix must be >= 1 and decoder.ar_suffix >= 0, got {self.ar_prefix}, {self.ar_suffix}"
            )
        check_schedule(self.schedule)
        check_official_l(self.official_l)

    def window_schedule(self, adapter: ModelAdapter) -> WindowSchedule:
        """The window rule on this model (the official one follows the adapter's model family)."""
        family = adapter.official_schedule
        return make_schedule(
            self.schedule, self.window, self.ar_prefix, self.ar_suffix, adapter.layout, family, self.official_l
        )

    def check_window_fits(self, adapter: ModelAdapter) -> None:
        """At start-up: the rule exists for this model's family and the window fits in its image."""
        self.window_schedule(adapter)
        if self.window > adapter.layout.n_tokens:
            raise ValueError(
                f"decoder.window={self.window} is larger than the {adapter.layout.n_tokens} tokens of a "
                f"{adapter.name} image"
            )


@dataclass
class WindowCall(DecodeCall):
    """A window decoder's call: its window rule on this model too."""

    schedule: WindowSchedule


@dataclass
class WindowStep:
    """One iteration, filled phase by phase. The chain is the run of slots that predicts positions committed,
    committed + 1, ...: the whole window for SJD, the part of the tree that is not a sibling for SJD-PAC."""

    call: WindowCall
    state: WindowState
    widths: list[int]  # forward inputs for each row this iteration (0: the row is complete)
    # draft
    inputs: torch.Tensor | None = None  # [B, W] window inputs
    drafts: torch.Tensor | None = None  # [B, C] the chain's drafts ...
    q: torch.Tensor | None = None  # [B, C, V] ... the distributions they were drawn from
    n_drafts: torch.Tensor | None = None  # [B] how many of them each row has
    # forward
    logits: Logits | None = None  # the forward's output (features included, for a drafter)
    positions: torch.Tensor | None = None  # [B, C+1] the position chain slot i predicts
    p: torch.Tensor | None = None  # [B, C+1, V] p at the chain's slots
    # verify
    result: VerifyResult | None = None  # accepted lengths and the token after them
    samples: torch.Tensor | None = None  # [B, C+1] the drafts the chain slots carry on ...
    samples_q: torch.Tensor | None = None  # [B, C+1, V] ... and their q
    # commit
    slots: torch.Tensor | None = None  # [B, A] the window slot holding the input before each committed token
    redraft: Redraft | None = None  # a continuation's drafts, where the commit drew them before its read (SJD-PAC)


class WindowDecoder(WindowSettings, Decoder):
    """The loop every window decoder runs; subclasses give the four phases."""

    redrafts = False  # whether a continuation (sjd.decoders.drafted, sjd.decoders.headed) redraws drafts after commits

    def generate(
        self,
        adapter: ModelAdapter,
        prompts: Sequence[Prompt],
        sampling: SamplingConfig,
        generators: Sequence[torch.Generator],
    ) -> DecodeResult:
        call = self.new_call(adapter, sampling, generators)
        state = self.start(call, prompts)
        while max(widths := self.widths(call.schedule, state)) > 0:
            step = self.new_step(call, state, widths)
            self.draft(step)
            call.clock.lap("draft")
            self.forward(step)
            call.clock.lap("pipeline")
            self.verify(step)
            call.clock.lap("verify")
            self.commit(step)
            call.clock.lap("commit")
        return state.finish(call.clock)

    # -- set-up ----------------------------------------------------------------------------------------
    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        self.check_window_fits(adapter)  # an unknown official family or too wide a window fails at start-up

    def new_call(
        self, adapter: ModelAdapter, sampling: SamplingConfig, generators: Sequence[torch.Generator]
    ) -> WindowCall:
        """Everything one generate() call works with: a fresh clock and the window rule on this model."""
        return WindowCall(adapter, ForwardClock(adapter), sampling, generators, self.window_schedule(adapter))

    def start(self, call: WindowCall, prompts: Sequence[Prompt]) -> WindowState:
        """Prefill and the first token as in AR, then the decoder's own per-call set-up (`begin`)."""
        state = self.new_state(len(prompts), call.layout, call.device)
        state.tokens[:, 0] = call.clock.start(prompts, call.sampling, call.generators)
        call.clock.defer_finite_check = True  # commit reads the accepted lengths and the NaN/inf flags in one copy
        state.read_counts = call.clock.read
        if state.committed_p is not None:  # where position 0 is a code (LlamaGen), the row below may draw from its p
            state.committed_p[:, 0] = call.clock.first_p  # remember_p at position 0, for every row
        self.begin(state, call)
        return state

    def new_state(self, B: int, layout: ImageLayout, device: torch.device) -> WindowState:
        """Empty per-row state."""
        return WindowState.empty(B, layout.n_tokens, layout.vocab_size, device)

    def begin(self, state: WindowState, call: WindowCall) -> None:
        """Per-call set-up after the first token (coupled decoders draw their noise tables here)."""

    @staticmethod
    def widths(schedule: WindowSchedule, state: WindowState) -> list[int]:
        """Forward inputs for each row this iteration (0 for a complete row)."""
        return [schedule.width(n, prev) for n, prev in zip(state.committed, state.previous)]

    def new_step(self, call: WindowCall, state: WindowState, widths: list[int]) -> WindowStep:
        return WindowStep(call, state, widths)

    # -- the four phases ---------------------------------------------------------------------------------
    @abstractmethod
    def draft(self, step: WindowStep) -> None:
        """Write the window's inputs and the chain's drafts, their q and their count."""

    @abstractmethod
    def forward(self, step: WindowStep) -> None:
        """Forward the window and write p at the chain's slots (the shared logits pipeline)."""

    @abstractmethod
    def verify(self, step: WindowStep) -> None:
        """Write the verification result and the drafts the slots carry on."""

    @abstractmethod
    def commit(self, step: WindowStep) -> None:
        """Commit into the row state, then `after_commit`."""

    def draw_redraft(
        self, step: WindowStep, committed: torch.Tensor, previous: torch.Tensor, tokens: torch.Tensor
    ) -> Redraft | None:
        """A continuation's drafts after the commit that leaves each row `committed` [B] long, `previous` [B] before
        it, `tokens` [B, A] at previous, previous + 1, ... (those below committed are committed): device work
        only. None without a continuation."""
        return None

    def room_of(self, state: WindowState, drafts: torch.Tensor, q: torch.Tensor) -> torch.Tensor | None:
        """[B, K, 2] on the device: what the draft plan must know on the host of drafts [B, K] (with q [B, K, V]) a
        row may carry, kept as `state.carried_room`; None for a decoder whose plan needs nothing (all but SJD-PAC)."""
        return None

    def read_room(self, state: WindowState, redraft: Redraft) -> None:
        """`redraft.room`, where the plan needs it of drafts a continuation drew before the loop: one read, once a
        decode (in the loop the commit brings it over in its own read)."""
        stats = self.room_of(state, redraft.drafts, redraft.q)
        if stats is not None:
            redraft.room = room_rows(state.read_counts(stats.flatten()), *stats.shape[:2])

    def after_commit(self, step: WindowStep) -> None:
        """After each commit: row b committed the tokens at positions state.previous[b] .. committed[b] - 1, and
        window slot `step.slots[b, a]` holds the input before the a-th of them (the target's features there are
        in `step.logits.features`). Decoders that draft with a trained drafter continue their drafts here."""
