"""Parallel Jacobi Decoding (PJD, CVPR 2026; docs/algorithms.md §8): 2-D drafts, one window per image row.

Image row r+1 starts once row r has `context` committed codes (the paper's c). Every active
row puts [its last committed token, its drafts] into one forward, at their true raster
positions. The row-causal mask lets a token see every committed token before it (cached or in
the window) and the earlier drafts of its own row, never another row's drafts. Rules per
iteration, as the official sampler:
- the top active row verifies with the speculative rule and commits the accepted prefix plus
  the residual (or bonus) token;
- a lower row commits only its accepted prefix: no residual resample and no bonus;
- after a row's first rejection, each later draft stays a draft if min(1, p/q) > `keep_threshold`,
  otherwise the model's new sample (q := p) replaces it; the rejected slot of a lower row gets
  the model's new sample too.
A lower row never runs ahead of the row above: its window is at most the columns the row above
has committed. Not lossless: a token of row r+1 conditions on part of row r only, and the
lower-row rules depart from speculative sampling (the audit measures the distance).

Our choices where the official code leaves room (config in conf/decoder/pjd.yaml):
- `window` counts a row's drafts (the official W=8); `context` = c (official 9).
- Positions outside the code grid must be grammar-forced (begin/end of image, size tokens,
  end-of-line): they are known in advance. Prefix tokens are written by the first forward; when
  the stream starts with the first code (Emu3: begin-of-image is in the prompt) that code is
  sampled from the prefill, as in AR.
- A row's first anchor is the token just before its first code. With end-of-line tokens that is
  the end-of-line of row r-1: forced, so committed from the start, and written by row r's first
  forward (the official "append EOL" step). Without them (Janus, LlamaGen, Anole) it is row r-1's
  last code P, not yet committed when row r starts. The released code is Lumina-only (it has
  end-of-line tokens), so this anchoring is ours: until P is committed, row r (while it has no
  code) is anchored on a draft of P at P's raster position: row r-1's draft of that column (the
  one in this window, else its carried one) if it has one, else a fresh one. That slot is seen
  by row r's own slots only, never by another row, and row r never commits it (row r-1 does);
  once P is committed the anchor is P itself. It is lossy in the same way PJD already is: a
  token of row r conditions on part of row r-1 only (here also on a draft of its last code),
  and its K/V keep that conditioning.
- The cache keeps and drops slots by position, so a position that appeared twice in one window
  (row r-1's draft of P and row r's anchor), or whose slot held a draft anchor, is marked not
  written after the forward: a later forward rewrites it, which replaces all its cached slots.
- A row completed by a residual/bonus token writes that token's K/V in the next forward (as the
  next row's anchor, or as a lead-in token once no row anchors on it).
- Fresh drafts use sjd.core.drafts (`init`): `vertical` copies the committed token above.
- `accepted` records codes committed per forward (the prefill entry counts the forced tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sjd.core.drafts import SCHEMES, fresh_drafts, one_hot
from sjd.core.sampling import SamplingConfig, logits_to_probs, sample_from
from sjd.core.staging import device_ints, to_device
from sjd.core.verify import VerifyResult
from sjd.core.verify import verify as speculative_verify
from sjd.decoders.base import Decoder, DecodeResult, ForwardClock
from sjd.models.base import ModelAdapter
from sjd.types import CUSTOM_MASK, WINDOW, ImageLayout, Logits, Prompt


@dataclass
class Segment:
    """One run of window inputs: committed lead-in tokens, then (for an image row) its drafts."""

    row: int  # image row, or -1 for lead-in tokens that only need their K/V written
    positions: list[int]
    n_committed: int  # leading inputs that are committed tokens
    drafts: torch.Tensor | None = None
    q: torch.Tensor | None = None
    # No-EOL layouts: the row's anchor (positions[0], then n_committed = 0) is this uncommitted draft of
    # the row above's last code, seen by this segment's own slots only and never committed by this row.
    anchor_draft: torch.Tensor | None = None

    @property
    def n_lead(self) -> int:
        """Inputs before the drafts: the committed tokens and the draft anchor, if any."""
        return self.n_committed + (self.anchor_draft is not None)


def window_holds(plan: list[Segment], draft_holds: dict[int, list[bool]]) -> list[bool]:
    """Per window slot of a batch row's plan: whether it held the token committed at its position after the commit.
    Committed inputs do, a draft anchor never counts, and draft slots as `draft_holds` says (by the segment's index in
    the plan; none that is not there)."""
    out: list[bool] = []
    for k, seg in enumerate(plan):
        if seg.row < 0:
            out += [True] * len(seg.positions)
        else:
            n = len(seg.positions) - seg.n_lead
            out += [True] * seg.n_committed + [False] * (seg.n_lead - seg.n_committed)
            out += draft_holds.get(k, [False] * n)
    return out


@dataclass
class SegmentTest:
    """One row segment's speculative test, on the device, before anything is read."""

    index: int  # the segment's index in its batch row's plan
    seg: Segment
    p: torch.Tensor  # p at its slots
    uniforms: torch.Tensor  # [2, n + 1]: the acceptance tests and the residual, then the next drafts
    result: VerifyResult
    outcome: torch.Tensor  # [2] long: drafts accepted, and whether the token after them equals the draft there


@dataclass
class RowCall:
    """What one generate() call of the row loop works with."""

    adapter: ModelAdapter
    sampling: SamplingConfig
    clock: ForwardClock


@dataclass
class RowState:
    """One batch row: tokens, what is committed, per image row its progress and carried drafts."""

    tokens: torch.Tensor  # [N] on the device
    # The host decides every commit and what each window writes, so these two live on the host: the plan reads them
    # position by position, and the forward's `keep` goes over in a non-blocking copy (sjd.core.staging).
    committed: torch.Tensor  # [N] bool, on the host
    written: torch.Tensor  # [N] bool, on the host: K/V in the cache
    done: list[int]  # codes committed per image row
    started: list[bool]
    carried: list[torch.Tensor]
    carried_q: list[torch.Tensor]
    accepted: list[int] = field(default_factory=list)

    def complete(self) -> bool:
        return bool(self.committed.all())


@dataclass(eq=False, kw_only=True)
class PJDDecoder(Decoder):
    requires = frozenset({WINDOW, CUSTOM_MASK})
    lossless = False

    name: str = "pjd"
    window: int = 8
    context: int = 9
    keep_threshold: float = 0.5
    init: str = "random"
    every_row_samples: bool = field(default=False, init=False)  # ZipAR: lower rows take their bonus sample too

    def __post_init__(self) -> None:
        if self.window < 1 or self.context < 1:
            raise ValueError(f"decoder.window and decoder.context must be >= 1, got {self.window}, {self.context}")
        if not 0.0 <= self.keep_threshold <= 1.0:
            raise ValueError(f"decoder.keep_threshold must be in [0, 1], got {self.keep_threshold}")
        if self.init not in SCHEMES:
            raise ValueError(f"decoder.init must be one of {SCHEMES}, got {self.init!r}")

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        layout = adapter.layout
        if layout.row_stride not in (layout.width, layout.width + 1):
            raise ValueError(
                f"decoder {self.name!r} needs rows of width or width + 1 (end-of-line) tokens; model "
                f"{adapter.name!r} has rows of {layout.row_stride} tokens for {layout.width} codes"
            )
        grid = torch.zeros(layout.n_tokens, dtype=torch.bool)
        for r in range(layout.height):
            grid[self._pos(layout, r, 0) : self._pos(layout, r, layout.width)] = True
        if ((layout.forced < 0) & ~grid).any():
            raise ValueError(
                f"decoder {self.name!r} needs every position outside the code grid of "
                f"model {adapter.name!r} to be grammar-forced"
            )
        if self.window > layout.n_tokens:
            raise ValueError(
                f"decoder.window={self.window} is larger than the {layout.n_tokens} tokens of a {adapter.name} image"
            )
        if self.context > layout.width:
            raise ValueError(
                f"decoder.context={self.context} exceeds the {layout.width} codes per row of {adapter.name}"
            )

    @staticmethod
    def _pos(layout: ImageLayout, row: int, col: int) -> int:
        return layout.first_code + row * layout.row_stride + col

    def generate(
        self,
        adapter: ModelAdapter,
        prompts: Sequence[Prompt],
        sampling: SamplingConfig,
        generators: Sequence[torch.Generator],
    ) -> DecodeResult:
        """The row loop: plan every batch row's segments, one forward of them all, then verify and commit every
        batch row (the hooks `plan_row`, `verify_rows` and `finish_call`, which SSD fills with its own). The host
        plans from what it decided itself; verification reads the device once an iteration."""
        layout, device, B = adapter.layout, adapter.device, len(prompts)
        call = self.new_call(adapter, sampling)
        first_tokens = call.clock.start(prompts, sampling, generators)
        call.clock.defer_finite_check = True  # the forwards' NaN/inf flags come over with the accepted counts
        states = [self._initial_state(layout, first_tokens[b], device) for b in range(B)]
        n_forward = [1] * B

        while not all(s.complete() for s in states):
            plans = [self.plan_row(s, call, generators[b]) for b, s in enumerate(states)]
            tokens, positions, mask = self.window_inputs(plans, states, layout.n_tokens, device)
            keep = torch.stack([s.committed for s in states])
            call.clock.lap("draft")
            # The layout was built on the host; it goes over in non-blocking copies (sjd.core.staging), no sync.
            on_device = [to_device(t, device) for t in (positions, keep, mask)]
            logits = call.clock.forward_at(tokens, *on_device)
            p = self.target_probs(logits, on_device[0], layout, sampling)
            call.clock.lap("pipeline")
            holds = self.verify_rows(states, plans, p, call, generators, logits, positions)
            for b, (s, plan) in enumerate(zip(states, plans)):
                if plan:
                    self.mark_written(s, plan, positions[b], holds[b])
                    n_forward[b] += 1
            call.clock.lap("commit")

        return self.finish_call(call, states, n_forward)

    # -- the hooks of the row loop -------------------------------------------------------------------------
    def new_call(self, adapter: ModelAdapter, sampling: SamplingConfig) -> RowCall:
        """What one generate() call works with: the model, the sampling and a fresh clock."""
        return RowCall(adapter, sampling, ForwardClock(adapter))

    def plan_row(self, s: RowState, call: RowCall, generator: torch.Generator) -> list[Segment]:
        return self.plan(s, call.adapter.layout, generator)

    def verify_rows(
        self,
        states: list[RowState],
        plans: list[list[Segment]],
        p: torch.Tensor,
        call: RowCall,
        generators: Sequence[torch.Generator],
        logits: Logits,
        positions: torch.Tensor,
    ) -> list[list[bool]]:
        """Verify and commit every batch row's segments (`logits` and `positions` [B, W], on the host: the
        forward's, for a decoder that reads the target's features). Each row's codes committed go to its
        `accepted`; returns, per batch row, `window_holds` of its window. Every segment is tested on the device
        first; one copy brings all their outcomes to the host, with the forwards' NaN/inf flags."""
        tests = [self.test_segments(plan, p[b], generators[b]) for b, plan in enumerate(plans)]
        call.clock.lap("verify")
        flat = [t.outcome for row in tests for t in row]
        values = call.clock.read(torch.cat(flat) if flat else torch.zeros(0, dtype=torch.long, device=p.device))
        holds, i = [], 0
        for s, plan, row in zip(states, plans, tests):
            top = min((seg.row for seg in plan if seg.row >= 0), default=-1)
            committed_now, draft_holds = 0, {}
            for t in row:
                n_acc, same = values[i], bool(values[i + 1])
                i += 2
                take = self.commit_segment(s, t, n_acc, top, call.adapter.layout)
                draft_holds[t.index] = [j < n_acc or (j == n_acc < take and same) for j in range(len(t.seg.drafts))]
                committed_now += take
            if plan:
                s.accepted.append(committed_now)
            holds.append(window_holds(plan, draft_holds))
        return holds

    def finish_call(self, call: RowCall, states: list[RowState], n_forward: list[int]) -> DecodeResult:
        return call.clock.finish(torch.stack([s.tokens for s in states]), n_forward, [s.accepted for s in states])

    @staticmethod
    def mark_written(s: RowState, plan: list[Segment], positions: torch.Tensor, holds: list[bool]) -> None:
        """After a forward: the cache holds a committed token's K/V only where the window wrote that very
        token, once (`positions` [W] on the host; `holds[i]`: whether slot i held the token committed at its
        position, `window_holds`). The cache keeps slots by position, so a position written twice in one window
        (row r-1's draft of its last code and row r's draft anchor there), or whose slot was a draft anchor
        (its K/V saw only part of the row above), is not written: a later forward rewrites it."""
        wrote = positions[positions >= 0]
        s.written[wrote] = s.committed[wrote] & torch.tensor(holds[: len(wrote)], dtype=torch.bool)
        counts = torch.bincount(wrote, minlength=len(s.written))
        stale = counts > 1
        for seg in plan:
            if seg.anchor_draft is not None:
                stale[seg.positions[0]] = True
        s.written[stale] = False

    # -- phases --------------------------------------------------------------------------------------
    def _initial_state(self, layout: ImageLayout, first: torch.Tensor, device: torch.device) -> RowState:
        forced = layout.forced_on(device)
        tokens = torch.where(forced >= 0, forced, 0)
        tokens[0] = first
        committed = layout.forced >= 0  # on the host, as the layout's own table
        committed[0] = True
        empty = torch.empty(0, dtype=torch.long, device=device)
        H = layout.height
        # Position 0 comes from the prefill, as in AR; when it is already the first code (the
        # begin-of-image token sits in the prompt), row 0 starts with one code done.
        done = [1 if layout.first_code == 0 else 0] + [0] * (H - 1)
        return RowState(
            tokens=tokens,
            committed=committed,
            written=torch.zeros_like(committed),
            done=done,
            started=[True] + [False] * (H - 1),
            carried=[empty] * H,
            carried_q=[torch.empty(0, layout.vocab_size, device=device)] * H,
            accepted=[int(committed.sum())],
        )

    def plan(self, s: RowState, layout: ImageLayout, generator: torch.Generator) -> list[Segment]:
        """Start rows whose row above has enough context, then build each active row's segment."""
        H, w = layout.height, layout.width
        for r in range(1, H):
            if not s.started[r] and s.started[r - 1] and s.done[r - 1] >= self.context:
                s.started[r] = True
        rows: list[Segment] = []
        for r in range(H):
            if not s.started[r] or s.done[r] == w:
                continue
            limit = w if r == 0 or s.done[r - 1] == w else s.done[r - 1]
            room = limit - s.done[r]
            if room <= 0:
                continue  # waiting for the row above
            n = min(self.window, room)  # ZipAR (window 0) forwards only the row's last token
            start = self._pos(layout, r, s.done[r])
            drafts, q = s.carried[r][:n], s.carried_q[r][:n]
            if len(drafts) < n:
                known = s.tokens.clone()
                known[start : start + len(drafts)] = drafts
                new = fresh_drafts(self.init, known, start + len(drafts), n - len(drafts), layout, generator)
                drafts, q = torch.cat([drafts, new]), torch.cat([q, one_hot(new, layout.vocab_size)])
            seg = Segment(row=r, positions=list(range(start - 1, start + n)), n_committed=1, drafts=drafts, q=q)
            if not s.committed[start - 1]:  # no end-of-line: anchored on a draft of the row above's last code
                seg.n_committed = 0
                seg.anchor_draft = self._anchor_draft(s, layout, r, rows, generator)
            rows.append(seg)
        # Lead-in: committed tokens whose K/V are missing and which no active row rewrites as its anchor
        # (without end-of-line tokens a finished row's last code is the next row's anchor).
        anchors = {seg.positions[0] for seg in rows if seg.n_committed}
        lead = [p for p in range(layout.first_code - 1) if not s.written[p]]
        lead += [
            self._pos(layout, r, w - 1)
            for r in range(H)
            if s.done[r] == w and not s.written[self._pos(layout, r, w - 1)]
        ]
        lead = [p for p in lead if p not in anchors]
        return ([Segment(row=-1, positions=lead, n_committed=len(lead))] if lead else []) + rows

    def _anchor_draft(
        self, s: RowState, layout: ImageLayout, r: int, rows: list[Segment], generator: torch.Generator
    ) -> torch.Tensor:
        """A draft of row r-1's last code: its draft in this window, else its carried one, else a fresh one
        (drafted, like a row's own drafts, from the first column of row r-1 without a draft up to the last)."""
        w, col = layout.width, s.done[r - 1]
        above = next((seg for seg in rows if seg.row == r - 1), None)
        drafts = above.drafts if above is not None and len(above.drafts) > len(s.carried[r - 1]) else s.carried[r - 1]
        if w - 1 - col < len(drafts):
            return drafts[w - 1 - col]
        start = self._pos(layout, r - 1, col) + len(drafts)
        known = s.tokens.clone()
        known[start - len(drafts) : start] = drafts
        end, stride = self._pos(layout, r - 1, w), layout.row_stride
        scheme = self.init
        if r >= 2 and not s.committed[start - stride : end - stride].all():
            scheme = "random" if scheme == "random" else "horizontal"  # never copy an uncommitted token above
        return fresh_drafts(scheme, known, start, end - start, layout, generator)[-1]

    def window_inputs(
        self, plans: list[list[Segment]], states: list[RowState], n_tokens: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Concatenate each batch row's segments; build the row-causal window mask. Tokens [B, W] on the device;
        positions [B, W] and the mask [B, W, W] on the host, where they were laid out."""
        W = max(1, max(sum(len(seg.positions) for seg in plan) for plan in plans))
        B = len(plans)
        tokens = torch.zeros(B, W, dtype=torch.long, device=device)
        positions = torch.full((B, W), -1, dtype=torch.long)
        segment_id = torch.full((B, W), -1, dtype=torch.long)
        is_committed = torch.zeros(B, W, dtype=torch.bool)
        for b, plan in enumerate(plans):
            i = 0
            for k, seg in enumerate(plan):
                n = len(seg.positions)
                positions[b, i : i + n] = torch.tensor(seg.positions)
                if seg.anchor_draft is not None:  # uncommitted: only this segment's own slots see it
                    tokens[b, i + seg.n_committed] = seg.anchor_draft
                if seg.drafts is not None:
                    tokens[b, i + seg.n_lead : i + n] = seg.drafts
                segment_id[b, i : i + n] = k
                is_committed[b, i : i + seg.n_committed] = True
                i += n
        # Committed inputs are the rows' own tokens, gathered on the device at the positions the host laid out.
        rows = torch.stack([s.tokens for s in states])
        at = to_device(torch.where(is_committed, positions, 0), device)
        tokens = torch.where(to_device(is_committed, device), rows.gather(1, at), tokens)
        idx = torch.arange(W)
        same = (segment_id[:, :, None] == segment_id[:, None, :]) & (segment_id[:, :, None] >= 0)
        own_row = same & (idx[None, :, None] >= idx[None, None, :])
        committed_before = is_committed[:, None, :] & (positions[:, None, :] < positions[:, :, None])
        return tokens, positions, own_row | committed_before

    def target_probs(
        self, logits: Logits, positions: torch.Tensor, layout: ImageLayout, sampling: SamplingConfig
    ) -> torch.Tensor:
        """p at every slot (`positions` [B, W] on the device): the distribution of the raster position after the
        slot's own."""
        predicted = torch.where(positions >= 0, positions + 1, layout.n_tokens).clamp(max=layout.n_tokens)
        return logits_to_probs(logits, predicted, layout, sampling)

    def next_drafts(
        self, seg: Segment, p_seg: torch.Tensor, uniforms: torch.Tensor, n: int, n_acc: int, take: int, end: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts and their q for the segment's slots take .. end-1 after a commit of its n drafts: the
        Jacobi update, except that a draft past the first rejection stays if min(1, p/q) exceeds the
        keep threshold."""
        samples = sample_from(p_seg, uniforms)
        new_d, new_q = samples[take:end], p_seg[take:end]
        lo, hi = take, min(end, n)  # the slots that held a draft
        if n_acc < n and hi > lo:  # drafts past the first rejection
            d = seg.drafts[lo:hi, None]
            ratio = p_seg[lo:hi].gather(1, d).squeeze(1) / seg.q[lo:hi].gather(1, d).squeeze(1).clamp_min(1e-30)
            keep = ratio.clamp(max=1.0) > self.keep_threshold
            if lo <= n_acc < hi:
                keep[n_acc - lo] = False  # the rejected slot itself takes the model's sample
            new_d = torch.cat([torch.where(keep, seg.drafts[lo:hi], new_d[: hi - lo]), new_d[hi - lo :]])
            new_q = torch.cat([torch.where(keep[:, None], seg.q[lo:hi], new_q[: hi - lo]), new_q[hi - lo :]])
        return new_d, new_q

    @staticmethod
    def test_segments(plan: list[Segment], p: torch.Tensor, generator: torch.Generator) -> list[SegmentTest]:
        """The speculative test of every row segment of one batch row's plan (p [W, V] at its slots), on the
        device: nothing is read."""
        tests, i = [], 0
        for k, seg in enumerate(plan):
            p_seg, i = p[i : i + len(seg.positions)], i + len(seg.positions)
            if seg.row < 0:
                continue
            n = len(seg.positions) - 1
            u = torch.rand(2, n + 1, generator=generator, device=p.device)
            result = speculative_verify(
                p_seg[None], seg.drafts[None], seg.q[None], device_ints([n], p.device), u[0, None, :n], u[0, n, None]
            )
            after = torch.cat([seg.drafts, seg.drafts.new_full((1,), -1)]).gather(0, result.n_accepted)
            outcome = torch.cat([result.n_accepted.long(), (result.next_token == after).long()])
            tests.append(SegmentTest(k, seg, p_seg, u, result, outcome))
        return tests

    def commit_segment(self, s: RowState, t: SegmentTest, n_acc: int, top: int, layout: ImageLayout) -> int:
        """Commit a tested segment's `n_acc` accepted drafts, and the residual (or bonus) token after them in the top
        active row (every row in ZipAR); its next drafts carry on. Returns the codes committed."""
        seg, w = t.seg, layout.width
        r, n, col = seg.row, len(seg.positions) - 1, s.done[seg.row]
        start = self._pos(layout, r, col)
        s.tokens[start : start + n_acc] = seg.drafts[:n_acc]
        take = n_acc
        if (r == top or self.every_row_samples) and col + n_acc < w:  # the residual or bonus token
            s.tokens[start + n_acc] = t.result.next_token[0]
            take += 1
        s.committed[start : start + take] = True
        s.done[r] = col + take
        s.carried[r], s.carried_q[r] = self.next_drafts(seg, t.p, t.uniforms[1], n, n_acc, take, min(n + 1, w - col))
        return take
