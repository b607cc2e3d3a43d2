"""SSD, Spatially Speculative Decoding (arXiv 2606.20543), as far as the paper states it (docs/algorithms.md §12.9).

Heads on the target's features predict the feature of the cell to the right and of the cell below; several image
rows are decoded at once, each a block of `window` codes a step: the top active row drafted along the row by the
right head applied to its own output (the continuous-latent chain), every row below drafted from the row above's
features by the below head. Verification accepts each drafted position on its own with min(1, p/q), a rejected
one taking a residual draw, and repeats for `rounds` forwards, each round re-verifying the block's tokens against
the target's p given the previous round's corrections; after the last round the whole block is committed. Not
lossless: a position is kept whether or not the positions before it were, and a lower row conditions on part of
the rows above only (the one-sample audit measures how far the samples are from the target's).

It runs on PJD's row machinery (sjd.decoders.pjd): rows at their true raster positions in one forward, a row-causal
mask (a token sees the committed tokens before it and its own row's earlier inputs), the cache kept by position.

Our choices where the paper, as we could read it, leaves room (all settings, conf/decoder/ssd.yaml):
- `window`: codes a row drafts a step (the paper's horizontal span, 5); `rows_below`: rows decoded under the top
  active row at once (1 or 2 in the paper); a row starts once the row above has `context` codes (5, a block);
- `rounds`: forwards per block (the paper's self-correcting rounds, 2). In round k > 1 the drafts are round k-1's
  tokens, with round k-1's p as their q;
- `drafting`: `chain` applies the right head (offset 1) to its own output, SSD's one right head; `direct` uses a
  head per offset (Hawk's and Medusa's);
- the heads read the target's feature after its final norm and go through the target's frozen LM head (our heads,
  sjd.drafters.heads; SSD reads before the norm and adds the token's embedding);
- the top row's block is drafted from the row's latest target feature at or before its first code (the target's
  own p where that feature predicts the first code itself), moved on by the right head; a row's first block from
  the below head on the row above; the image's first block, with no feature yet, at random;
- the token after a block (from the last slot's p) is committed only when the last round accepted every draft, so
  that p is conditioned on the committed tokens;
- layouts with an end-of-line token per row only (Lumina-mGPT's, Emu3's), so a row's first input is committed.

Each sample records, per generated position, which row of its block committed it (`extras["block_depth"]`: 0 the
top active row, drafted along the row; 1, 2, ... the rows below it, drafted from the row above; -1 no block: the
prefill's first token and the grammar-forced ones), counted when the block was drafted, so that the one-sample
audit can say where the impossible tokens fall (sjd.audit.in_run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sjd.core.drafts import fresh_drafts, one_hot
from sjd.core.sampling import SamplingConfig, logits_to_probs, sample_from
from sjd.core.staging import to_device
from sjd.decoders.base import DecodeResult, ForwardClock
from sjd.decoders.pjd import PJDDecoder, RowCall, RowState, Segment, window_holds
from sjd.drafters.heads import HEADS_KEY, DraftHeads, heads_record, heads_settings, load_heads
from sjd.models.base import ModelAdapter
from sjd.types import CUSTOM_MASK, FEATURES, WINDOW, ImageLayout, Logits

DRAFTING = ("chain", "direct")


@dataclass
class SSDRowState(RowState):
    """PJD's row state, plus what SSD keeps: each image row's round in its block, the latest target feature that
    predicts each position (all CFG rows), and the heads calls."""

    rounds_done: list[int] = field(default_factory=list)
    # each image row's current block: its row counted from the top active row when it was drafted (0 = the top)
    depth: list[int] = field(default_factory=list)
    block_depth: torch.Tensor | None = None  # [N] long, on the host: the `depth` of the block that committed each
    features: torch.Tensor | None = None  # [N, copies, H]
    has_feature: torch.Tensor | None = None  # [N] bool, on the host (it knows which positions the forwards wrote)
    head_forwards: int = 0


@dataclass
class SSDCall(RowCall):
    """The row loop's call, with the heads and which LM head rows they run."""

    heads: DraftHeads
    code_head: bool


@dataclass(eq=False, kw_only=True)
class SSDDecoder(PJDDecoder):
    requires = frozenset({WINDOW, CUSTOM_MASK, FEATURES})
    lossless = False

    name: str = "ssd"
    window: int = 5
    rows_below: int = 2
    rounds: int = 2
    context: int = 5
    drafting: str = "chain"
    heads: dict | None = None
    keep_threshold: float = field(default=0.0, init=False)
    init: str = field(default="random", init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rows_below < 0 or self.rounds < 1:
            raise ValueError(
                f"decoder.rows_below must be >= 0 and decoder.rounds >= 1, got {self.rows_below}, {self.rounds}"
            )
        if self.drafting not in DRAFTING:
            raise ValueError(f"decoder.drafting must be one of {DRAFTING}, got {self.drafting!r}")
        self.heads = heads_settings(self.heads, self.name)

    def config(self) -> dict:
        return {
            "name": self.name,
            "window": self.window,
            "rows_below": self.rows_below,
            "rounds": self.rounds,
            "context": self.context,
            "drafting": self.drafting,
            "heads": {**self.heads, "record": heads_record(self.heads["weights"])},
        }

    # -- the heads -------------------------------------------------------------------------------------
    def needed_offsets(self, layout: ImageLayout) -> tuple[int, ...]:
        """The right head(s) and the below head this setting drafts with."""
        right = (1,) if self.drafting == "chain" else tuple(range(1, max(self.window, 2)))
        return right + (layout.row_stride,)

    def load(self, adapter: ModelAdapter) -> DraftHeads:
        return load_heads(adapter, self.heads["weights"], self.needed_offsets(adapter.layout))

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        layout = adapter.layout
        if layout.row_stride != layout.width + 1:
            raise ValueError(
                f"decoder {self.name!r} needs an end-of-line token after every image row; model {adapter.name!r} "
                f"has rows of {layout.row_stride} tokens for {layout.width} codes"
            )
        if self.load(adapter).config.tokens:
            raise ValueError(
                f"decoder {self.name!r} chains its heads on their own predicted features, which have no token to "
                f"read; `{HEADS_KEY}`={self.heads['weights']} are token-aware heads: use heads trained without "
                "heads.tokens"
            )
        missing = [d for d in self.needed_offsets(layout) if d not in self.load(adapter).offsets]
        if missing:
            raise ValueError(
                f"decoder {self.name!r} (drafting={self.drafting}) needs heads at offsets {missing} on "
                f"{adapter.name!r} (the row stride is {layout.row_stride}); `{HEADS_KEY}`={self.heads['weights']} "
                f"has {list(self.load(adapter).offsets)}: train them with `python scripts/train_heads.py "
                f"model={adapter.name} heads.vertical=1`"
            )

    def networks(self, adapter: ModelAdapter) -> dict[str, torch.nn.Module]:
        return {"heads": self.load(adapter)}

    # -- the row loop's hooks (sjd.decoders.pjd) ----------------------------------------------------------
    def new_call(self, adapter: ModelAdapter, sampling: SamplingConfig) -> SSDCall:
        heads, code_head = self.load(adapter), self.heads["head"] == "codes"
        return SSDCall(adapter, sampling, ForwardClock(adapter), heads, code_head)

    def plan_row(self, s: SSDRowState, call: SSDCall, generator: torch.Generator) -> list[Segment]:
        return self.ssd_plan(s, call, generator)

    def verify_rows(
        self,
        states: list[SSDRowState],
        plans: list[list[Segment]],
        p: torch.Tensor,
        call: SSDCall,
        generators: Sequence[torch.Generator],
        logits: Logits,
        positions: torch.Tensor,
    ) -> list[list[bool]]:
        hidden = logits.features.hidden
        B = logits.cond.shape[0]
        for b, plan in enumerate(plans):
            if plan:  # the row's conditional, then unconditional, features
                self.remember_features(states[b], positions[b], hidden[b::B])
        return self.verify_blocks(states, plans, p, call, generators)

    def finish_call(self, call: SSDCall, states: list[SSDRowState], n_forward: list[int]) -> DecodeResult:
        result = super().finish_call(call, states, n_forward)
        result.extras["head_forwards"] = [s.head_forwards for s in states]
        result.extras["heads"] = [self.window] * len(states)  # a call runs a head about once per drafted column
        result.extras["block_depth"] = [s.block_depth.tolist() for s in states]
        return result

    def _initial_state(self, layout: ImageLayout, first: torch.Tensor, device: torch.device) -> SSDRowState:
        base = super()._initial_state(layout, first, device)
        no_block = torch.full((layout.n_tokens,), -1, dtype=torch.long)  # the prefill's token, the forced ones
        return SSDRowState(**vars(base), rounds_done=[0] * layout.height, depth=[0] * layout.height,
                           block_depth=no_block)  # fmt: skip

    @staticmethod
    def remember_features(s: SSDRowState, positions: torch.Tensor, hidden: torch.Tensor) -> None:
        """Keep each slot's feature as the one that predicts the position after the slot's own (`positions` [W] on
        the host: which slots those are is the host's to say)."""
        N = len(s.tokens)
        if s.features is None:
            s.features = hidden.new_zeros(N, hidden.shape[0], hidden.shape[-1])
            s.has_feature = torch.zeros(N, dtype=torch.bool)
        slots = ((positions >= 0) & (positions + 1 < N)).nonzero()[:, 0]
        predicted = positions[slots] + 1
        at, rows = to_device(predicted, hidden.device), to_device(slots, hidden.device)
        s.features[at] = hidden[:, rows].transpose(0, 1)
        s.has_feature[predicted] = True

    def ssd_plan(self, s: SSDRowState, call: SSDCall, generator: torch.Generator) -> list[Segment]:
        """PJD's plan with SSD's rows (at most 1 + rows_below active, each starting `context` codes behind the row
        above) and drafts: a block mid-way through its rounds keeps its tokens, a new block is drafted by the
        heads."""
        layout = call.adapter.layout
        H, w = layout.height, layout.width
        active = sum(1 for r in range(H) if s.started[r] and s.done[r] < w)
        for r in range(1, H):
            if active > self.rows_below:
                break
            if not s.started[r] and s.started[r - 1] and s.done[r - 1] >= self.context:
                s.started[r] = True
                active += 1
        new_blocks: list[tuple[int, int, int]] = []  # (row, first position, codes)
        segments: list[Segment] = []
        top = min((r for r in range(H) if s.started[r] and s.done[r] < w), default=-1)
        for r in range(H):
            if not s.started[r] or s.done[r] == w:
                continue
            limit = w if r == 0 or s.done[r - 1] == w else s.done[r - 1]
            start = self._pos(layout, r, s.done[r])
            if s.rounds_done[r] > 0:  # mid-way through its rounds: the block keeps its size and tokens
                drafts, q = s.carried[r], s.carried_q[r]
            else:
                n = min(self.window, limit - s.done[r])
                if n <= 0:
                    continue  # waiting for the row above
                drafts, q = None, None
                new_blocks.append((r, start, n))
                s.depth[r] = r - top  # fixed for the block's rounds: how it was drafted (along the row, or below)
            n = len(drafts) if drafts is not None else new_blocks[-1][2]
            segments.append(
                Segment(row=r, positions=list(range(start - 1, start + n)), n_committed=1, drafts=drafts, q=q)
            )
        if new_blocks:
            drafted = self.draft_blocks(s, call, new_blocks, top, generator)
            for seg in segments:
                if seg.drafts is None:
                    seg.drafts, seg.q = drafted[seg.row]
        lead = [p for p in range(layout.first_code - 1) if not s.written[p]]
        lead += [
            self._pos(layout, r, w - 1)
            for r in range(H)
            if s.done[r] == w and not s.written[self._pos(layout, r, w - 1)]
        ]
        return ([Segment(row=-1, positions=lead, n_committed=len(lead))] if lead else []) + segments

    def draft_blocks(
        self,
        s: SSDRowState,
        call: SSDCall,
        blocks: list[tuple[int, int, int]],
        top: int,
        generator: torch.Generator,
    ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """One heads call drafting every new block: the top row along the row from the feature predicting its
        first code, a lower row by the below head on the row above's features; each draft a sample of its q."""
        layout, heads = call.adapter.layout, call.heads
        stride, V = layout.row_stride, layout.vocab_size
        latents, where, randoms = [], [], {}
        for r, start, n in blocks:
            cells = torch.arange(start, start + n, device=s.tokens.device)
            known = s.has_feature if s.features is not None else torch.zeros_like(s.committed)
            if r > top and bool(known[start - stride : start + n - stride].all()):  # a lower row: below the row above
                latents.append(heads.one(s.features[cells - stride].transpose(0, 1), stride))  # [copies, n, H]
                where.append((r, start, n))
                continue
            row_first = self._pos(layout, r, 0)
            left = [j for j in range(start, row_first - 1, -1) if bool(known[j])]
            if left:  # the latest feature of this row at or before the block, moved on by the right head
                first = s.features[left[0]].unsqueeze(1)  # [copies, 1, H]
                for _ in range(start - left[0]):
                    first = heads.one(first, 1)
            elif r > 0 and bool(known[start - stride]):
                first = heads.one(s.features[start - stride].unsqueeze(1), stride)
            else:  # the image's first block: no feature yet
                new = fresh_drafts("random", s.tokens, start, n, layout, generator)
                randoms[r] = (new, one_hot(new, V))
                continue
            chain = [first]
            for j in range(1, n):
                chain.append(heads.one(chain[-1], 1) if self.drafting == "chain" else heads.one(first, j))
            latents.append(torch.cat(chain, 1))
            where.append((r, start, n))
        out = dict(randoms)
        if not latents:
            return out
        hidden = torch.cat(latents, 1)  # [copies, M, H]
        positions = torch.cat([torch.arange(st, st + n, device=hidden.device) for _, st, n in where])[None]
        logits = (call.adapter.code_head if call.code_head else call.adapter.head)(hidden.to(heads.up.dtype))
        q = logits_to_probs(logits, positions, layout, call.sampling)[0]  # [M, V]
        drafts = sample_from(q, torch.rand(len(q), generator=generator, device=q.device))
        s.head_forwards += 1
        i = 0
        for r, _, n in where:
            out[r] = drafts[i : i + n], q[i : i + n]
            i += n
        return out

    def verify_blocks(
        self,
        states: list[SSDRowState],
        plans: list[list[Segment]],
        p: torch.Tensor,
        call: SSDCall,
        generators: Sequence[torch.Generator],
    ) -> list[list[bool]]:
        """SSD's verification of every row block: each position on its own; the last round commits the block.

        A block in its last round draws the token after it only if every draft was kept, and its batch row's later
        blocks draw their tests after that draw; so each batch row's blocks are tested in order up to such a block,
        every batch row at once, then one copy brings their outcomes (with the forwards' NaN/inf flags) to the host,
        which commits them, and so on. Blocks in an earlier round read nothing (their tokens are their next drafts,
        on the device); an iteration where no block ends reads nothing, its NaN/inf flags wait for the next read."""
        layout = call.adapter.layout
        pending = [[(k, seg) for k, seg in enumerate(plan) if seg.row >= 0] for plan in plans]
        offsets = [self.slot_offsets(plan) for plan in plans]
        cursor, draft_holds, committed_now = [0] * len(plans), [{} for _ in plans], [0] * len(plans)
        while True:
            tested = []
            for b, s in enumerate(states):
                while cursor[b] < len(pending[b]):
                    k, seg = pending[b][cursor[b]]
                    cursor[b] += 1
                    r, n = seg.row, len(seg.positions) - 1
                    p_seg = p[b, offsets[b][k] : offsets[b][k] + n + 1]
                    tokens, kept = independent_accept(p_seg[:n], seg.drafts, seg.q, generators[b])
                    s.rounds_done[r] += 1
                    if s.rounds_done[r] < self.rounds:
                        s.carried[r], s.carried_q[r] = tokens, p_seg[:n]
                        continue
                    outcome = torch.cat([kept.all()[None], tokens == seg.drafts]).long()
                    tested.append((b, k, seg, p_seg, tokens, outcome))
                    if s.done[r] + n < layout.width:
                        break  # the token after the block: drawn, or not, before the row's next draws
            if not tested:
                break
            values = call.clock.read(torch.cat([t[-1] for t in tested]))
            i = 0
            for b, k, seg, p_seg, tokens, outcome in tested:
                flags, i = values[i : i + len(outcome)], i + len(outcome)
                committed_now[b] += self.commit_block(
                    states[b], seg, p_seg, tokens, bool(flags[0]), layout, generators[b]
                )
                draft_holds[b][k] = [bool(f) for f in flags[1:]]  # whether each slot's draft is the committed token
        for s, plan, codes in zip(states, plans, committed_now):
            if plan:
                s.accepted.append(codes)
        return [window_holds(plan, holds) for plan, holds in zip(plans, draft_holds)]

    @staticmethod
    def slot_offsets(plan: list[Segment]) -> list[int]:
        """The window slot where each segment of a batch row's plan starts."""
        out, i = [], 0
        for seg in plan:
            out.append(i)
            i += len(seg.positions)
        return out

    def commit_block(
        self,
        s: SSDRowState,
        seg: Segment,
        p_seg: torch.Tensor,
        tokens: torch.Tensor,
        all_kept: bool,
        layout: ImageLayout,
        generator: torch.Generator,
    ) -> int:
        """Commit a block after its last round, and the token after it where every draft was kept (so that its p
        is conditioned on the committed tokens); returns the codes committed."""
        r, n, w = seg.row, len(seg.positions) - 1, layout.width
        col = s.done[r]
        start = self._pos(layout, r, col)
        s.tokens[start : start + n] = tokens
        take = n
        if all_kept and col + n < w:  # the token after the block, given the committed tokens
            u = torch.rand(1, generator=generator, device=p_seg.device)
            s.tokens[start + n] = sample_from(p_seg[n : n + 1], u)[0]
            take += 1
        s.committed[start : start + take] = True
        s.block_depth[start : start + take] = s.depth[r]  # the token after the block too: its row's block drew it
        s.done[r] = col + take
        s.rounds_done[r] = 0
        s.carried[r], s.carried_q[r] = tokens[:0], p_seg[:0]
        return take


def independent_accept(
    p: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """SSD's rule: draft j is kept with probability min(1, p_j(d_j) / q_j(d_j)) whatever happened before it, and
    a rejected one replaced by a draw from the residual max(p_j - q_j, 0) (p_j where that is empty). Returns the
    tokens and which drafts were kept, on the device."""
    n = len(drafts)
    u = torch.rand(2, n, generator=generator, device=p.device)
    pd = p.gather(1, drafts[:, None]).squeeze(1)
    qd = q.gather(1, drafts[:, None]).squeeze(1).clamp_min(1e-30)
    kept = u[0] < (pd / qd).clamp(max=1.0)
    residual = (p - q).clamp_min(0.0)
    empty = residual.sum(-1, keepdim=True) <= 0
    residual = torch.where(empty, p, residual)
    tokens = torch.where(kept, drafts, sample_from(residual / residual.sum(-1, keepdim=True), u[1]))
    return tokens, kept
