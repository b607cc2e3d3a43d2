"""Window decoders that continue their drafts with a trained drafter: our hybrids (docs/algorithms.md §12.6).

A window decoder commits, per forward, the accepted drafts and one more token: a residual sample after a
rejection, or the bonus. Every carried draft after that token was drawn given the draft it replaced, so the
next forward usually accepts little right after it: about half of coupled SJD's forwards commit a single code
on a calibrated stand-in. Here, after each commit, the drafter (sjd.drafters) catches up on the committed
tokens, with the target's features of this very forward, and drafts the next `continuation` positions
afresh, each a sample of its q given the drafts before it; those drafts and their q replace the carried ones
there. Further positions keep the decoder's own carried drafts.

Exact: the replaced drafts are new draws from q, each given the drafts before it, recorded with that q, and
every carried draft further out was drawn before them and independently of them, from the q it carries, so
speculative verification of the window is the usual one (the coupled decoders' argument for the rest).

- `sjd_drafter`, `csjd_drafter`: SJD and coupled SJD (sjd.decoders.sjd, sjd.decoders.coupled) with the continuation;
- `csjd_pac_drafter`: our SJD-PAC combination (sjd.decoders.sjd_pac), whose siblings at the first carried
  drafts are then drawn without replacement from the drafter's q.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from sjd.core.staging import device_ints
from sjd.decoders.coupled import CoupledSJDDecoder
from sjd.decoders.drafter_part import DrafterPart
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.sjd_pac import SJDPACDecoder
from sjd.decoders.window import WindowCall, WindowStep
from sjd.decoders.window_state import Redraft, WindowState
from sjd.drafters.checkpoint import drafter_settings, load_drafter
from sjd.drafters.drafter import DrafterRun
from sjd.drafters.tree import draw_chain
from sjd.models.base import ModelAdapter
from sjd.types import FEATURES


@dataclass
class DraftedCall(WindowCall):
    """A window call with the trained drafter's per-call state (set up in `begin`)."""

    drafter: DrafterRun | None = None


@dataclass(eq=False, kw_only=True)
class DrafterContinuation(DrafterPart):
    """Mixin before a window decoder class: the drafter's settings (their record, check and network are
    DrafterPart's) and the two hooks it fills (`begin`, `after_commit`). `continuation` is how many positions
    after each commit the drafter drafts; the drafter runs
    the image codes' rows of the LM head by default (`decoder.drafter.head`)."""

    redrafts = True  # after every commit (sjd.decoders.window)

    drafter: dict | None = None
    continuation: int = 4

    def __post_init__(self) -> None:
        super().__post_init__()
        self.drafter = drafter_settings(self.drafter, self.name, "codes")
        if self.continuation < 1:
            raise ValueError(f"decoder.continuation must be >= 1, got {self.continuation}")

    def new_call(self, adapter: ModelAdapter, sampling, generators) -> DraftedCall:
        call = super().new_call(adapter, sampling, generators)
        return DraftedCall(**{f.name: getattr(call, f.name) for f in fields(call)})

    def begin(self, state: WindowState, call: DraftedCall) -> None:
        super().begin(state, call)
        net = load_drafter(call.adapter, self.drafter["weights"])
        call.drafter = DrafterRun(
            net,
            call.adapter,
            call.sampling,
            len(state.committed),
            self.continuation,
            call.clock.lap,
            code_head=self.drafter["head"] == "codes",
        )
        call.drafter.start(call.clock.prefill_features, state.tokens[:, 0])
        redraft = self.continue_drafts(call, device_ints(state.committed, state.tokens.device))
        self.read_room(state, redraft)
        self.adopt(state, redraft)
        state.drafter_forwards = call.drafter.row_forwards

    def after_commit(self, step: WindowStep) -> None:
        super().after_commit(step)
        state, call = step.state, step.call
        N = state.tokens.shape[1]
        going_on = any(n < N for n in state.committed)  # read on the host: the lists are the state's own
        if step.redraft is None and going_on:  # drawn here, after the commit's read (SJD-PAC's commit: before it)
            device = state.tokens.device
            committed = device_ints(state.committed, device)
            previous = device_ints(state.previous, device)
            offsets = torch.arange(step.slots.shape[1], device=device)
            tokens = state.tokens.gather(1, (previous[:, None] + offsets[None, :]).clamp(max=N - 1))
            step.redraft = self.draw_redraft(step, committed, previous, tokens)
        if going_on:
            self.adopt(state, step.redraft)
            state.drafter_forwards = call.drafter.row_forwards

    def draw_redraft(
        self, step: WindowStep, committed: torch.Tensor, previous: torch.Tensor, tokens: torch.Tensor
    ) -> Redraft:
        """The drafter catches up on the committed tokens, with the target's features of this forward, then drafts
        each row's next `continuation` positions."""
        state, logits, slots, call = step.state, step.logits, step.slots, step.call
        device, N, A = state.tokens.device, state.tokens.shape[1], slots.shape[1]
        offsets = torch.arange(A, device=device)
        count = torch.where(committed < N, committed - previous, 0).clamp(max=A)
        gen_pos = (previous[:, None] + offsets[None, :]).clamp(max=N - 1)
        tokens = torch.where(offsets[None, :] < count[:, None], tokens, 0)
        hidden = logits.features.hidden
        index = call.drafter.to_rows(slots)[..., None].expand(-1, -1, hidden.shape[-1])
        call.drafter.catch_up(hidden.gather(1, index), tokens, gen_pos, count)
        return self.continue_drafts(call, committed)

    def continue_drafts(self, call: DraftedCall, committed: torch.Tensor) -> Redraft:
        """Each row's next `continuation` drafts (after its last committed token, `committed` [B] - 1) from the
        drafter."""
        drafts, q = draw_chain(call.drafter, committed - 1, self.continuation, call.generators)
        return Redraft(drafts, q)

    def adopt(self, state: WindowState, redraft: Redraft) -> None:
        """The drafter's drafts replace each row's first carried ones."""
        N = state.tokens.shape[1]
        for b, n in enumerate(state.committed):
            k = max(0, min(self.continuation, N - n))
            if k:
                state.carried[b] = torch.cat([redraft.drafts[b, :k], state.carried[b][k:]])
                state.carried_q[b] = torch.cat([redraft.q[b, :k], state.carried_q[b][k:]])
                if state.carried_room is not None:
                    state.carried_room[b] = redraft.room[b][:k] + state.carried_room[b][k:]


@dataclass(eq=False, kw_only=True)
class SJDDrafterDecoder(DrafterContinuation, SJDDecoder):
    requires = SJDDecoder.requires | {FEATURES}

    name: str = "sjd_drafter"
    verification: str = field(default="token", init=False)


@dataclass(eq=False, kw_only=True)
class CoupledDrafterDecoder(DrafterContinuation, CoupledSJDDecoder):
    requires = CoupledSJDDecoder.requires | {FEATURES}

    name: str = "csjd_drafter"


@dataclass(eq=False, kw_only=True)
class SJDPACDrafterDecoder(DrafterContinuation, SJDPACDecoder):
    requires = SJDPACDecoder.requires | {FEATURES}

    name: str = "csjd_pac_drafter"
    continuation: int = 16
