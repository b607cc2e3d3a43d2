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
from sjd.decoders.window_state import WindowState
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
        self.continue_drafts(state, call)
        state.drafter_forwards = call.drafter.row_forwards

    def after_commit(self, step: WindowStep) -> None:
        state, logits, slots, call = step.state, step.logits, step.slots, step.call
        run = call.drafter
        device = state.tokens.device
        N = state.tokens.shape[1]
        committed = device_ints(state.committed, device)
        previous = device_ints(state.previous, device)
        take = committed - previous
        A = slots.shape[1]
        offsets = torch.arange(A, device=device)
        going_on = committed < N
        count = torch.where(going_on, take, 0).clamp(max=A)
        gen_pos = (previous[:, None] + offsets[None, :]).clamp(max=N - 1)
        tokens = torch.where(offsets[None, :] < count[:, None], state.tokens.gather(1, gen_pos), 0)
        hidden = logits.features.hidden
        index = run.to_rows(slots)[..., None].expand(-1, -1, hidden.shape[-1])
        if any(n < N for n in state.committed):  # read on the host: the lists are the state's own
            run.catch_up(hidden.gather(1, index), tokens, gen_pos, count)
            self.continue_drafts(state, call)
            state.drafter_forwards = run.row_forwards

    def continue_drafts(self, state: WindowState, call: DraftedCall) -> None:
        """Each row's next `continuation` drafts (after its last committed token) from the drafter."""
        device = state.tokens.device
        root = device_ints(state.committed, device) - 1
        drafts, q = draw_chain(call.drafter, root, self.continuation, call.generators)
        N = state.tokens.shape[1]
        for b, n in enumerate(state.committed):
            k = max(0, min(self.continuation, N - n))
            if k:
                state.carried[b] = torch.cat([drafts[b, :k], state.carried[b][k:]])
                state.carried_q[b] = torch.cat([q[b, :k], state.carried_q[b][k:]])


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
