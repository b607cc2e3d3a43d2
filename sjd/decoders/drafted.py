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

from dataclasses import dataclass, fields

import torch

from sjd.core.schedule import OFFICIAL_L
from sjd.decoders.coupled import CoupledSJDDecoder
from sjd.decoders.sjd import SJDDecoder, WindowCall, WindowState
from sjd.decoders.sjd_pac import SJDPACDecoder
from sjd.drafters.checkpoint import check_weights_setting, load_drafter, training_record
from sjd.drafters.drafter import DrafterRun
from sjd.drafters.tree import draw_chain
from sjd.models.base import ModelAdapter
from sjd.types import FEATURES, Logits


@dataclass
class DraftedCall(WindowCall):
    """A window call with the trained drafter's per-call state (set up in `begin`)."""

    drafter: DrafterRun | None = None


class DrafterContinuation:
    """Mixin before a window decoder class: the drafter's settings and the two hooks it fills (`begin`,
    `after_commit`). `continuation` is how many positions after each commit the drafter drafts."""

    drafter: dict
    continuation: int

    def set_drafter(self, drafter: dict | None, continuation: int) -> None:
        drafter = dict(drafter or {})
        unknown = sorted(set(drafter) - {"weights"})
        if unknown:
            raise ValueError(f"decoder.drafter: unknown setting(s) {unknown} (settings: weights)")
        check_weights_setting(drafter.get("weights"), self.name)
        if continuation < 1:
            raise ValueError(f"decoder.continuation must be >= 1, got {continuation}")
        self.drafter, self.continuation = {"weights": str(drafter["weights"])}, continuation

    def config(self) -> dict:
        out = super().config()
        out["drafter"] = {**self.drafter, "record": training_record(self.drafter["weights"])}
        return out

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        load_drafter(adapter, self.drafter["weights"])

    def networks(self, adapter: ModelAdapter) -> dict[str, torch.nn.Module]:
        return {"drafter": load_drafter(adapter, self.drafter["weights"])}

    def new_call(self, adapter: ModelAdapter, sampling, generators) -> DraftedCall:
        call = super().new_call(adapter, sampling, generators)
        return DraftedCall(**{f.name: getattr(call, f.name) for f in fields(call)})

    def begin(self, state: WindowState, call: DraftedCall) -> None:
        super().begin(state, call)
        net = load_drafter(call.adapter, self.drafter["weights"])
        call.drafter = DrafterRun(
            net, call.adapter, call.sampling, len(state.committed), self.continuation, call.clock.lap
        )
        call.drafter.start(call.clock.prefill_features, state.tokens[:, 0])
        self.continue_drafts(state, call)
        state.drafter_forwards = call.drafter.row_forwards

    def after_commit(self, state: WindowState, logits: Logits, slots: torch.Tensor, call: DraftedCall) -> None:
        run = call.drafter
        device = state.tokens.device
        N = state.tokens.shape[1]
        committed = torch.as_tensor(state.committed, device=device)
        previous = torch.as_tensor(state.previous, device=device)
        take = committed - previous
        A = slots.shape[1]
        offsets = torch.arange(A, device=device)
        going_on = committed < N
        count = torch.where(going_on, take, 0).clamp(max=A)
        gen_pos = (previous[:, None] + offsets[None, :]).clamp(max=N - 1)
        tokens = torch.where(offsets[None, :] < count[:, None], state.tokens.gather(1, gen_pos), 0)
        hidden = logits.features.hidden
        index = run.to_rows(slots)[..., None].expand(-1, -1, hidden.shape[-1])
        if bool(going_on.any()):
            run.catch_up(hidden.gather(1, index), tokens, gen_pos, count)
            self.continue_drafts(state, call)
            state.drafter_forwards = run.row_forwards

    def continue_drafts(self, state: WindowState, call: DraftedCall) -> None:
        """Each row's next `continuation` drafts (after its last committed token) from the drafter."""
        device = state.tokens.device
        root = torch.as_tensor(state.committed, device=device) - 1
        drafts, q = draw_chain(call.drafter, root, self.continuation, call.generators)
        N = state.tokens.shape[1]
        for b, n in enumerate(state.committed):
            k = max(0, min(self.continuation, N - n))
            if k:
                state.carried[b] = torch.cat([drafts[b, :k], state.carried[b][k:]])
                state.carried_q[b] = torch.cat([q[b, :k], state.carried_q[b][k:]])


class SJDDrafterDecoder(DrafterContinuation, SJDDecoder):
    requires = SJDDecoder.requires | {FEATURES}

    def __init__(
        self,
        name: str = "sjd_drafter",
        drafter: dict | None = None,
        continuation: int = 4,
        window: int = 16,
        init: str = "random",
        ar_prefix: int = 1,
        ar_suffix: int = 0,
        forced_drafts: bool = True,
        schedule: str = "harness",
        official_l: int = OFFICIAL_L,
    ) -> None:
        SJDDecoder.__init__(self, name, window, init, ar_prefix, ar_suffix, forced_drafts, schedule=schedule,
                            official_l=official_l)  # fmt: skip
        self.set_drafter(drafter, continuation)


class CoupledDrafterDecoder(DrafterContinuation, CoupledSJDDecoder):
    requires = CoupledSJDDecoder.requires | {FEATURES}

    def __init__(
        self,
        name: str = "csjd_drafter",
        drafter: dict | None = None,
        continuation: int = 4,
        window: int = 16,
        init: str = "vertical_dist",
        coupling: str = "maximal",
        ar_prefix: int = 1,
        ar_suffix: int = 0,
        forced_drafts: bool = True,
        schedule: str = "harness",
        official_l: int = OFFICIAL_L,
    ) -> None:
        CoupledSJDDecoder.__init__(self, name, window, init, coupling, ar_prefix, ar_suffix, forced_drafts,
                                   schedule, official_l)  # fmt: skip
        self.set_drafter(drafter, continuation)


class SJDPACDrafterDecoder(DrafterContinuation, SJDPACDecoder):
    requires = SJDPACDecoder.requires | {FEATURES}

    def __init__(
        self,
        name: str = "csjd_pac_drafter",
        drafter: dict | None = None,
        continuation: int = 16,
        window: int = 64,
        init: str = "vertical_dist",
        coupling: str = "maximal",
        branches: int = 4,
        branch_depth: int = 3,
        ar_prefix: int = 1,
        ar_suffix: int = 0,
        forced_drafts: bool = True,
        schedule: str = "harness",
        official_l: int = OFFICIAL_L,
    ) -> None:
        SJDPACDecoder.__init__(self, name, window, init, coupling, branches, branch_depth, ar_prefix, ar_suffix,
                               forced_drafts, schedule, official_l)  # fmt: skip
        self.set_drafter(drafter, continuation)
