"""Window decoders whose next drafts come from parallel draft heads: our exact variants of the head family.

Hawk and SSD draft many positions in one forward with heads trained on the target's features (docs/algorithms.md
§12.8). Here the heads (sjd.drafters.heads) only propose: after every commit, one heads call on the target's feature
at the slot that predicted the last committed token redraws the positions `offsets` after it, each a fresh sample
of its head's q, recorded with that q. Those drafts replace the carried ones there (a position right after the
carried drafts extends them); every other position keeps the decoder's own carried draft. Unlike the trained
drafter's continuation (sjd.decoders.drafted), the heads cost one call whatever they draft: no sequential drafter
forwards.

Exact: a head's q depends only on committed tokens (through the feature), and each replaced draft is a fresh draw
from it, made before the target sees it, so speculative verification of the window with the recorded q is the
usual one; the carried drafts further out were drawn before and independently of these (the argument of
sjd.decoders.drafted). The micro-model audit and the one-sample audit hold each variant to it.

- `sjd_heads`: SJD (sjd.decoders.sjd) with the heads;
- `csjd_pac_heads`: our SJD-PAC combination (sjd.decoders.sjd_pac), whose siblings at the first carried drafts are
  then drawn without replacement from a head's q; `csjd_pac_heads_missing` the same with `replace: missing`.

`replace: none` leaves every carried draft alone: sjd.decoders.head_siblings uses the heads' drafts as siblings only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sjd.core.staging import device_ints
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.sjd_pac import SJDPACDecoder
from sjd.decoders.window import WindowCall, WindowStep
from sjd.decoders.window_state import Redraft, WindowState
from sjd.drafters.heads import DraftHeads, draw_from_heads, heads_record, heads_settings, load_heads
from sjd.models.base import ModelAdapter
from sjd.types import FEATURES

REPLACE = ("all", "missing", "none")


@dataclass(eq=False, kw_only=True)
class HeadsContinuation:
    """Mixin before a window decoder class: the heads' settings (`weights`; `head`, the LM head's rows they run:
    the image codes' by default) and the two hooks they fill (`begin`, `after_commit`)."""

    redrafts = True  # after every commit (sjd.decoders.window)

    heads: dict | None = None
    # all: the heads' drafts replace the carried ones; missing: they only extend them; none: they leave the carried
    # drafts alone (a decoder that uses them otherwise: sjd.decoders.head_siblings's siblings)
    replace: str = "all"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.heads = heads_settings(self.heads, self.name)
        if self.replace not in REPLACE:
            raise ValueError(f"decoder.replace must be one of {REPLACE}, got {self.replace!r}")

    def config(self) -> dict:
        out = super().config()
        out["heads"] = {**self.heads, "record": heads_record(self.heads["weights"])}
        return out

    def load(self, adapter: ModelAdapter) -> DraftHeads:
        """The heads (`random` ones at the default offsets: horizontal, 1 to 4)."""
        return load_heads(adapter, self.heads["weights"])

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        self.load(adapter)

    def networks(self, adapter: ModelAdapter) -> dict[str, torch.nn.Module]:
        return {"heads": self.load(adapter)}

    def begin(self, state: WindowState, call: WindowCall) -> None:
        super().begin(state, call)
        heads = self.load(call.adapter)
        state.head_forwards, state.heads = [0] * len(state.committed), len(heads.offsets)
        features = call.clock.prefill_features.hidden[:, -1]  # the prompt's last slot predicts position 0
        predicts = device_ints(state.committed, features.device) - 1
        redraft = self.draw_heads(call, features, predicts, self.read_tokens(heads, state.tokens, predicts))
        self.read_room(state, redraft)
        self.adopt(state, call, redraft)

    def after_commit(self, step: WindowStep) -> None:
        super().after_commit(step)
        state, call = step.state, step.call
        if all(n >= state.tokens.shape[1] for n in state.committed):
            return
        if step.redraft is None:  # drawn here, after the commit's read (SJD-PAC's commit draws it before its read)
            device = state.tokens.device
            committed = device_ints(state.committed, device)
            previous = device_ints(state.previous, device)
            step.redraft = self.draw_redraft(step, committed, previous, None)
        self.adopt(state, call, step.redraft)

    def draw_redraft(
        self, step: WindowStep, committed: torch.Tensor, previous: torch.Tensor, tokens: torch.Tensor | None
    ) -> Redraft:
        """One heads call on the feature that predicted each row's last committed token (and, for token-aware heads,
        that token: from `tokens` [B, A] at previous, previous + 1, ... where the commit gives them before writing
        them, else from the state, written)."""
        last = (committed - previous - 1).clamp(min=0, max=step.slots.shape[1] - 1)  # the last committed token's
        slot = step.slots.gather(1, last[:, None])[:, 0]  # ... input-before slot, whose feature predicts it
        hidden = step.logits.features.hidden
        copies = hidden.shape[0] // len(committed)
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        heads = self.load(step.call.adapter)
        if tokens is None:
            read = self.read_tokens(heads, step.state.tokens, committed - 1)
        else:
            read = tokens.gather(1, last[:, None])[:, 0] if heads.config.tokens else None
        return self.draw_heads(step.call, hidden[rows, slot.repeat(copies)], committed - 1, read)

    @staticmethod
    def read_tokens(heads: DraftHeads, tokens: torch.Tensor, at: torch.Tensor) -> torch.Tensor | None:
        """Each row's committed token at `at` [B] from `tokens` [B, N], for token-aware heads only (no op else)."""
        if not heads.config.tokens:
            return None
        return tokens.gather(1, at.clamp(min=0)[:, None])[:, 0]

    def draw_heads(
        self, call: WindowCall, features: torch.Tensor, predicts: torch.Tensor, tokens: torch.Tensor | None = None
    ) -> Redraft:
        """One heads call on `features` [R, H], each row's predicting its position `predicts` [B] (whose committed
        token `tokens` [B] token-aware heads read): a draft at each of the heads' offsets after it, and its q."""
        heads = self.load(call.adapter)
        code_head = self.heads["head"] == "codes"
        _, drafts, q = draw_from_heads(
            heads, call.adapter, call.sampling, features, predicts, call.generators, code_head, tokens
        )
        call.clock.lap("drafter")
        return Redraft(drafts, q)

    def adopt(self, state: WindowState, call: WindowCall, redraft: Redraft) -> None:
        """The heads' drafts at `offsets` after each row's last committed position replace (or extend) the row's
        carried drafts (with their sibling room, where the state keeps it)."""
        heads, N = self.load(call.adapter), state.tokens.shape[1]
        drafts, q = redraft.drafts, redraft.q
        for b, n in enumerate(state.committed):
            if n >= N:
                continue
            state.head_forwards[b] += 1
            if self.replace == "none":
                continue
            carried, carried_q = state.carried[b], state.carried_q[b]
            room = list(state.carried_room[b]) if state.carried_room is not None else None
            for k in sorted(range(len(heads.offsets)), key=lambda k: heads.offsets[k]):
                index = int(heads.offsets[k]) - 1  # the draft's position - committed: predicts = committed - 1
                if n + index >= N or index > len(carried):
                    break
                if index < len(carried) and self.replace == "missing":
                    continue
                if index == len(carried):
                    carried = torch.cat([carried, drafts[b, k : k + 1]])
                    carried_q = torch.cat([carried_q, q[b, k : k + 1]])
                    if room is not None:
                        room.append(redraft.room[b][k])
                else:
                    if carried is state.carried[b]:
                        carried, carried_q = carried.clone(), carried_q.clone()
                    carried[index], carried_q[index] = drafts[b, k], q[b, k]
                    if room is not None:
                        room[index] = redraft.room[b][k]
            state.carried[b], state.carried_q[b] = carried, carried_q
            if room is not None:
                state.carried_room[b] = room


@dataclass(eq=False, kw_only=True)
class SJDHeadsDecoder(HeadsContinuation, SJDDecoder):
    requires = SJDDecoder.requires | {FEATURES}

    name: str = "sjd_heads"
    verification: str = field(default="token", init=False)


@dataclass(eq=False, kw_only=True)
class SJDPACHeadsDecoder(HeadsContinuation, SJDPACDecoder):
    requires = SJDPACDecoder.requires | {FEATURES}

    name: str = "csjd_pac_heads"
