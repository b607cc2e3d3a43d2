"""SJD-PAC: branch drafting (SJD-PAC's proactive drafting, docs/algorithms.md §6) on coupled SJD.

The decoder of `decoder=sjd_pac` (the paper's settings), `decoder=csjd_pac` (our combination: its defaults) and
`decoder=csjd_tree` (siblings at the first draft only).
After a rejection, the draft right after the committed residual was drawn given the rejected
token, and it is accepted with probability sum(min(p, q)) only (experiment=toy_branch counts the
forwards that commit a single token). So at the first `branch_depth` draft positions the window
carries `branches` candidates instead of one: the chain draft c plus siblings s_1 .. s_{K-1}
drawn *without replacement* from the same q. A sibling is a window slot at the chain draft's
position that sees the chain before it and itself, nothing else.

Verification at the chain's first rejection is recursive rejection sampling: c is tested
against p with q; on rejection p <- norm(max(0, p - q)) and s_i is tested against that with
q_i = q without c, s_1 .. s_{i-1}, renormalised (the distribution s_i was drawn from); if every
candidate is rejected the last residual is sampled. Each stage is a speculative-sampling step
whose fallback is the next stage, so the committed token is distributed exactly as p. An
accepted sibling ends the chain, and its own output gives the next token exactly (a bonus):
the chain's carried draft there is tested against it and kept if it passes, so the drafts
after it, drawn given that draft, stay in step. Next drafts for the chain slots come from the
coupling, as in coupled SJD (its `Coupled` part). A committed sibling is written through `WindowState.commit`'s
`end_row` hook, so the rest of the commit is SJD's.

Our choices (SJD-PAC's code is unreleased; its page gives depth 3, width 4):
- `window` counts every forward input (lead-in, chain drafts, siblings): at the same window the
  chain is shorter by the siblings, so comparisons with SJD are at equal forward width. Where
  long converged stretches are accepted at once, the slots the siblings take from the chain's
  tail can cost more than the siblings win (experiment=toy_branch measures both).
- Siblings go only where the chain draft's q is a distribution (a carried draft); a fresh
  one-hot draft has nothing to draw them from, and those slots go to the chain.
- Sibling slots are transient in the cache; when one is committed, the next forward rewrites
  its position as a lead-in slot (the chain slot there held the rejected draft).
- The window's shape depends on how many siblings each carried draft can have (its q's sibling room). The
  device computes it for every draft a row may carry on, and it comes to the host in the commit's one read,
  with the accepted lengths: one host sync an iteration. A drafter's or heads' continuation is drawn before
  that read for the same reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sjd.core.sampling import sample_from
from sjd.core.staging import device_ints, to_device
from sjd.core.verify import (
    VerifyResult,
    accept_tests,
    accepted_prefix,
    recursive_rejection,
    residual,
    stop_slot,
)
from sjd.decoders.base import DecodeResult, ForwardClock
from sjd.decoders.coupled import Coupled
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.window import WindowCall, WindowStep
from sjd.decoders.window_state import WindowState, room_rows
from sjd.types import CUSTOM_MASK, WINDOW, ImageLayout

ONE_HOT = 1.0 - 1e-6  # a q whose top mass is not below this has no room for siblings


@dataclass
class TreeWindow:
    """One forward's inputs and where each row's chain and siblings sit in it."""

    tokens: torch.Tensor  # [B, W]
    positions: torch.Tensor  # [B, W] generated positions, -1 = padding
    mask: torch.Tensor  # [B, W, W] window slots each query sees
    transient: torch.Tensor  # [B, W] sibling slots
    chain_slot: torch.Tensor  # [B, C+1] slot whose output predicts position committed + i
    drafts: torch.Tensor  # [B, C] chain drafts
    q: torch.Tensor  # [B, C, V] their draft distributions
    n_drafts: torch.Tensor  # [B]
    chain_lengths: list[int]  # n_drafts on the host (the window was laid out from it: reading it costs nothing)
    siblings: torch.Tensor  # [B, D, K-1] sibling ids at chain draft k
    sibling_slot: torch.Tensor  # [B, D, K-1] their slots (0 where absent)
    has_sibling: torch.Tensor  # [B, D, K-1]
    keep: torch.Tensor | None = None  # [B, N] generated positions whose cached K/V each row keeps
    sibling_q: torch.Tensor | None = None  # [B, D, K-1, V] where each sibling was drawn on its own from its q


@dataclass
class TreeVerdict:
    """What verification of one tree window decided, per row."""

    result: VerifyResult  # the chain's accepted length and the token after it (when no sibling is taken)
    p_chain: torch.Tensor  # [B, C+1, V] p at the chain's slots
    picked: torch.Tensor  # [B] the accepted sibling's index at the first rejection, -1 for none
    sib_p: torch.Tensor  # [B, V] the accepted sibling's own next-token p (read only where one is)
    bonus: torch.Tensor  # [B] the token after an accepted sibling
    samples: torch.Tensor  # [B, C+1] next drafts for the chain slots
    samples_q: torch.Tensor  # [B, C+1, V] their q


@dataclass
class TreeState(WindowState):
    """SJD's row state, and per row what the cache holds and how often a sibling was committed."""

    cached: list[int] = field(default_factory=list)  # generated positions below cached[b] hold committed K/V
    branch_commits: list[int] = field(default_factory=list)  # forwards whose committed token was a sibling

    def finish(self, clock: ForwardClock) -> DecodeResult:
        result = super().finish(clock)
        result.extras["branch_commits"] = self.branch_commits
        return result


@dataclass
class TreeStep(WindowStep):
    """An SJD-PAC iteration: the tree window, p at all its slots, and the verdict."""

    window: TreeWindow | None = None
    tree_p: torch.Tensor | None = None  # [B, W, V] p at every slot, siblings included
    verdict: TreeVerdict | None = None


@dataclass(eq=False, kw_only=True)
class SJDPACDecoder(Coupled, SJDDecoder):
    requires = frozenset({WINDOW, CUSTOM_MASK})

    name: str = "csjd_pac"
    window: int = 64
    branches: int = 4
    branch_depth: int = 3

    def __post_init__(self) -> None:
        if self.branches < 1 or self.branch_depth < 0:
            raise ValueError(
                f"decoder.branches must be >= 1 and decoder.branch_depth >= 0, got {self.branches}, {self.branch_depth}"
            )
        super().__post_init__()

    @property
    def siblings_from_q(self) -> bool:
        """Whether the plan gives a carried draft siblings by the room its q has (`carried_room`)."""
        return self.branches > 1 and self.branch_depth > 0

    def new_state(self, B: int, layout: ImageLayout, device: torch.device) -> TreeState:
        state = super().new_state(B, layout, device)
        state.carried_room = [[] for _ in range(B)] if self.siblings_from_q else None
        return TreeState(**vars(state), cached=[0] * B, branch_commits=[0] * B)

    def new_step(self, call: WindowCall, state: WindowState, widths: list[int]) -> TreeStep:
        return TreeStep(call, state, widths)

    def draft(self, step: TreeStep) -> None:
        """The tree window: lead-in, chain drafts, siblings."""
        state, call = step.state, step.call
        win = self.build_window(state, state.cached, step.widths, call)
        cached = device_ints(state.cached, call.device)
        win.keep = torch.arange(call.layout.n_tokens, device=call.device)[None, :] < cached[:, None]
        step.window, step.drafts, step.q, step.n_drafts = win, win.drafts, win.q, win.n_drafts

    def forward(self, step: TreeStep) -> None:
        """The tree through the model; p at every slot (output at position i predicts i + 1)."""
        win, call = step.window, step.call
        N = call.layout.n_tokens
        step.logits = call.clock.forward_at(win.tokens, win.positions, win.keep, win.mask, win.transient)
        predicted = torch.where(win.positions >= 0, win.positions + 1, N).clamp(max=N)
        step.tree_p = self.kernels.pipeline(step.logits, predicted, call.layout, call.sampling)

    def verify(self, step: TreeStep) -> None:
        """Chain tests; recursive rejection sampling over the siblings at the first rejection (`tree_tests`); then
        the drafts the chain's slots carry on. Writes the verdict into the step (the phase's one output)."""
        win, p, call = step.window, step.tree_p, step.call
        C, device = win.drafts.shape[1], p.device
        u = draw_tree_uniforms(call.generators, win.chain_lengths, C, self.branches - 1, device)
        sibling_slot = win.sibling_slot
        n_acc, accepted, next_token, picked, sib_p, bonus, p_chain = self.kernels(tree_tests)(
            p, win.chain_slot, win.drafts, win.q, win.n_drafts, win.has_sibling, win.siblings,
            sibling_slot, win.sibling_q, u["accept"], u["sibling"], u["final"], u["bonus"], u["bonus_accept"],
            self.branches, self.branch_depth,
        )  # fmt: skip
        step.result = VerifyResult(n_acc, next_token, accepted)
        offsets = torch.arange(C + 1, device=device)
        step.positions, step.p = device_ints(step.state.committed, device)[:, None] + offsets, p_chain
        step.samples, step.samples_q = self.next_drafts(step, u["jacobi"])
        step.verdict = TreeVerdict(step.result, p_chain, picked, sib_p, bonus, step.samples, step.samples_q)

    def commit(self, step: TreeStep) -> None:
        """One read brings the accepted lengths and siblings to the host, and with them the sibling room of every
        draft a row may carry on (the next window's shape depends on it): the chain slots' next drafts and a
        continuation's, which is drawn here, before the read, from the commit as the device knows it."""
        state, win, verdict = step.state, step.window, step.verdict
        step.slots = self.tree_committed_slots(win, verdict)
        if self.redrafts:
            committed, previous, tokens = self.commit_on_device(step)
            step.redraft = self.draw_redraft(step, committed, previous, tokens)
        room = self.room_of(state, verdict.samples, verdict.samples_q)
        redraft_room = self.room_of(state, step.redraft.drafts, step.redraft.q) if step.redraft else None
        host_room = self.commit_tree(state, win, verdict, step.widths, room, redraft_room)
        if redraft_room is not None:
            step.redraft.room = host_room
        self.after_commit(step)

    def commit_on_device(self, step: TreeStep) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What `commit_tree` will commit, as device tensors, before any read: each row's committed and previous
        length [B] after it, and the tokens at previous, previous + 1, ... [B, C+2] (those below committed
        are the committed ones)."""
        state, win, verdict, device = step.state, step.window, step.verdict, step.call.device
        N, (B, C) = state.tokens.shape[1], win.drafts.shape
        n, previous = device_ints(state.committed, device), device_ints(state.previous, device)
        live = device_ints(step.widths, device) > 0
        j, picked = verdict.result.n_accepted, verdict.picked
        take = j + 1 + ((picked >= 0) & (n + j + 1 < N)).long()  # the sibling's bonus, inside the image
        end = verdict.result.next_token
        D, K1 = win.siblings.shape[1:]
        if D and K1:
            rows = torch.arange(B, device=device)
            sibling = win.siblings[rows, j.clamp(max=D - 1), picked.clamp(min=0)]
            end = torch.where(picked >= 0, sibling, end)
        offsets = torch.arange(C + 2, device=device)[None, :]
        chain = torch.cat([win.drafts, torch.zeros(B, 2, dtype=win.drafts.dtype, device=device)], 1)
        tokens = torch.where(
            offsets < j[:, None], chain, torch.where(offsets == j[:, None], end[:, None], verdict.bonus[:, None])
        )
        return torch.where(live, n + take, n), torch.where(live, n, previous), tokens

    # -- phases --------------------------------------------------------------------------------------
    def room_of(self, state: WindowState, drafts: torch.Tensor, q: torch.Tensor) -> torch.Tensor | None:
        return room_stats(q, drafts) if state.carried_room is not None else None

    def sibling_room(self, state: WindowState) -> list[list[tuple[bool, int]]]:
        """Per row, for each of its first `branch_depth` carried drafts: whether the draft's q has room for
        siblings (a one-hot q has none) and how many siblings q can give (its ids with mass, the chain draft's
        excepted); on the host already, read with the last commit's counts (`carried_room`)."""
        if not self.siblings_from_q:
            return [[] for _ in state.committed]
        return [room[: self.branch_depth] for room in state.carried_room]

    def chain_plan(
        self, state: WindowState, b: int, lead: int, width: int, layout: ImageLayout, room: list[tuple[bool, int]]
    ) -> tuple[int, list[int]]:
        """How many chain drafts row b gets and how many siblings each of the first `depth` of them gets (`room`: the
        row's `sibling_room`), from host integers alone."""
        n, N, K = state.committed[b], layout.n_tokens, self.branches
        budget = max(width - lead, 0) if width else 0  # inputs left after the lead-in
        depth = 0
        if K > 1:
            while depth < min(self.branch_depth, len(room)) and room[depth][0] and (depth + 1) * K <= budget:
                depth += 1
        n_chain = min(budget - depth * (K - 1), N - n)
        return n_chain, [min(K - 1, room[k][1]) for k in range(depth)]

    def plan_rows(self, state: WindowState, cached: list[int], widths: list[int], call: WindowCall) -> list[tuple]:
        """Per row: (lead-in length, chain drafts, their q, siblings, sibling counts per chain draft, the
        siblings' own q or None). The chains are topped up for the batch at once; then each row draws its
        siblings with its generator, after its chain's fresh drafts, as it would alone."""
        leads = [state.committed[b] - cached[b] if width else 0 for b, width in enumerate(widths)]
        plans = [self.chain_plan(state, b, leads[b], widths[b], call.layout, room)
                 for b, room in enumerate(self.sibling_room(state))]  # fmt: skip
        chains = self.top_up(state, [n_chain for n_chain, _ in plans], call.layout, call.generators)
        rows = []
        for b, ((_, counts), (d, dq)) in enumerate(zip(plans, chains)):
            sib, sib_q = self.row_siblings(state, b, d, dq, counts, call.generators[b])
            rows.append((leads[b], d, dq, sib, counts, sib_q))
        return rows

    def build_window(
        self,
        state: WindowState,
        cached: list[int],
        widths: list[int],
        call: WindowCall,
    ) -> TreeWindow:
        """[lead-in: committed tokens to (re)write][chain drafts][siblings], per row: planned from host integers
        (`plan_rows`: the chains topped up for the batch at once, each row's siblings from its own draws), laid out
        for the batch at once."""
        rows = self.plan_rows(state, cached, widths, call)
        lengths = [row[1].shape[0] for row in rows]
        W = max(1, max(row[0] + c + sum(row[4]) for row, c in zip(rows, lengths)))
        # The layout's tables are built on the host from host integers (no device value is read) and go over in
        # non-blocking copies (sjd.core.staging.to_device), as the per-row layout always did.
        lead, n = torch.tensor([row[0] for row in rows]), torch.tensor(state.committed)
        line = lead + torch.tensor(lengths)  # lead-in and chain: one causal run
        slot = torch.arange(W)[None]
        in_line = slot < line[:, None]
        positions = torch.where(in_line, (n - lead)[:, None] + slot, -1)
        mask = in_line[:, :, None] & in_line[:, None, :] & (slot[:, None, :] <= slot[:, :, None])
        step = torch.arange(max(lengths) + 1)[None]
        first = lead[:, None] - 1  # the slot before the first chain draft: the lead-in's last (0 without one)
        chain_slot = torch.where((step <= line[:, None] - lead[:, None]) & (first >= 0), first + step, 0)
        drafts = torch.nn.utils.rnn.pad_sequence([row[1] for row in rows], batch_first=True)
        q = torch.nn.utils.rnn.pad_sequence([row[2] for row in rows], batch_first=True)
        tokens = self.window_tokens(state, drafts, lead, line, n, W)
        D, K1, B = self.branch_depth, self.branches - 1, len(rows)
        siblings = torch.zeros(B, D, K1, dtype=torch.long, device=tokens.device)
        sibling_slot, has_sibling = torch.zeros(B, D, K1, dtype=torch.long), torch.zeros(B, D, K1, dtype=torch.bool)
        n_drafts, transient = device_ints(lengths, tokens.device), torch.zeros_like(in_line)
        window = TreeWindow(tokens, positions, mask, transient, chain_slot, drafts, q, n_drafts, lengths, siblings,
                            sibling_slot, has_sibling)  # fmt: skip
        return self.place_siblings(window, rows, n, lead, line)

    @staticmethod
    def window_tokens(
        state: WindowState, drafts: torch.Tensor, lead: torch.Tensor, line: torch.Tensor, n: torch.Tensor, W: int
    ) -> torch.Tensor:
        """[B, W]: each row's lead-in (its committed tokens from n - lead) and chain drafts, 0 after them (the
        siblings are placed later); gathered on the device with indices laid out on the host."""
        device, slot = state.tokens.device, torch.arange(W)[None]
        from_lead, from_chain = slot < lead[:, None], (slot >= lead[:, None]) & (slot < line[:, None])
        lead_index = ((n - lead)[:, None] + slot).clamp(0, state.tokens.shape[1] - 1)
        padded = torch.cat([drafts, torch.zeros(len(drafts), 1, dtype=drafts.dtype, device=device)], 1)
        chain_index = (slot - lead[:, None]).clamp(0, padded.shape[1] - 1)
        lead_tokens = state.tokens.gather(1, to_device(lead_index, device))
        chain_tokens = padded.gather(1, to_device(chain_index, device))
        zero = torch.zeros((), dtype=drafts.dtype, device=device)
        return torch.where(to_device(from_lead, device), lead_tokens,
                           torch.where(to_device(from_chain, device), chain_tokens, zero))  # fmt: skip

    def place_siblings(self, win: TreeWindow, rows: list[tuple], n: torch.Tensor, lead: torch.Tensor,
                       line: torch.Tensor) -> TreeWindow:  # fmt: skip
        """Sibling i of chain draft k of row b after the row's chain: at position n + k, seeing the chain before
        it; written for the batch in one indexed write a table. The host tables then go over in non-blocking
        copies (sjd.core.staging), no sync."""
        device, V, K1 = win.tokens.device, win.q.shape[-1], self.branches - 1
        entries = []  # (row, slot, chain draft, sibling)
        for b, row in enumerate(rows):
            pairs = [(k, i) for k, count in enumerate(row[4]) for i in range(count)]
            entries += [(b, int(line[b]) + j, k, i) for j, (k, i) in enumerate(pairs)]
        own_q = any(row[5] is not None for row in rows)
        if own_q:
            win.sibling_q = torch.zeros(len(rows), self.branch_depth, K1, V, device=device)
        if entries:
            b, at, k, i = (torch.tensor(column) for column in zip(*entries))
            sib = torch.nn.utils.rnn.pad_sequence([row[3] for row in rows], batch_first=True)
            bd, kd, id_ = (to_device(t, device) for t in (b, k, i))
            win.tokens[bd, to_device(at, device)] = sib[bd, kd, id_]
            win.siblings[bd, kd, id_] = sib[bd, kd, id_]
            win.positions[b, at] = n[b] + k
            win.mask[b, at] = torch.arange(win.mask.shape[2])[None] < (lead[b] + k)[:, None]
            win.transient[b, at] = True
            win.sibling_slot[b, k, i], win.has_sibling[b, k, i] = at, True
            if own_q:
                shape = (0, K1, V)
                sib_q = [row[5] if row[5] is not None else torch.zeros(shape, device=device) for row in rows]
                win.sibling_q[bd, kd, id_] = torch.nn.utils.rnn.pad_sequence(sib_q, batch_first=True)[bd, kd, id_]
        win.positions, win.mask, win.transient, win.chain_slot, win.sibling_slot, win.has_sibling = (
            to_device(t, device)
            for t in (win.positions, win.mask, win.transient, win.chain_slot, win.sibling_slot, win.has_sibling)
        )
        return win

    def row_siblings(
        self,
        state: WindowState,
        b: int,
        d: torch.Tensor,
        dq: torch.Tensor,
        counts: list[int],
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Row b's siblings of its first len(counts) chain drafts `d` ([D, K-1] ids, the first counts[k] of row k
        used) and, where each was drawn on its own from a distribution of its own, those ([D, K-1, V]; None here:
        SJD-PAC's are drawn without replacement from the chain draft's q, draw_siblings)."""
        sib = torch.zeros(len(counts), self.branches - 1, dtype=torch.long, device=state.tokens.device)
        if counts:
            u = torch.rand(len(counts), dq.shape[-1], generator=generator, device=state.tokens.device)
            sib, _ = draw_siblings(dq[: len(counts)], d[: len(counts)], self.branches - 1, u)
        return sib, None

    @staticmethod
    def commit_tree(
        state: TreeState,
        win: TreeWindow,
        verdict: TreeVerdict,
        widths: list[int],
        room: torch.Tensor | None = None,
        redraft_room: torch.Tensor | None = None,
    ) -> list[list[tuple[bool, int]]] | None:
        """SJD's commit of the accepted chain; where a sibling was accepted, it and its bonus end the row. The
        accepted lengths and siblings come to the host in one copy, with the sibling room [B, C+1, 2] of the chain
        slots' next drafts (kept as `carried_room`) and [B, K, 2] of a continuation's drafts (returned)."""
        N, B = state.tokens.shape[1], len(widths)
        parts = [
            verdict.result.n_accepted,
            verdict.picked,
            *(t.flatten() for t in (room, redraft_room) if t is not None),
        ]
        read = state.read_counts(torch.cat(parts))  # one copy for all
        n_accepted, picked = read[:B], read[B : 2 * B]
        rest = read[2 * B :]
        samples_room = room_rows(rest, *room.shape[:2]) if room is not None else None
        rest = rest[room.numel() :] if room is not None else rest
        cached, branch_commits = state.cached, state.branch_commits

        def end_row(b: int, n: int, j: int) -> int:
            cached[b] = n + j  # lead-in and accepted chain drafts were written with their tokens
            if picked[b] < 0:
                return state.end_with_next_token(b, n, j, verdict.result.next_token[b], verdict.p_chain[b, j])
            state.tokens[b, n + j] = win.siblings[b, j, picked[b]]  # drawn from p at n + j, remembered with the chain
            take = j + 1
            if n + take < N:
                state.tokens[b, n + take] = verdict.bonus[b]
                state.remember_p(b, n + take, verdict.sib_p[b : b + 1])  # the bonus was drawn from the sibling's p
                take += 1
            state.last_p[b] = verdict.sib_p[b]
            branch_commits[b] += 1
            return take

        # The chain's slots hold the next drafts: lead-in and sibling slots carry nothing.
        spans = [n + 1 if w else 0 for n, w in zip(win.chain_lengths, widths)]
        state.commit(
            verdict.result, win.drafts, verdict.samples, verdict.p_chain, spans, verdict.samples_q, end_row, n_accepted,
            samples_room,
        )  # fmt: skip
        return room_rows(rest, *redraft_room.shape[:2]) if redraft_room is not None else None

    @staticmethod
    def tree_committed_slots(win: TreeWindow, verdict: TreeVerdict) -> torch.Tensor:
        """[B, C+2]: the slot holding the input before each committed token: the chain's slots up to the first
        rejection, and after an accepted sibling, the sibling's own slot (its output gave the bonus)."""
        B, C1 = win.chain_slot.shape
        device = win.tokens.device
        slots = torch.cat([win.chain_slot, win.chain_slot[:, -1:]], 1)
        j, picked = verdict.result.n_accepted, verdict.picked
        K = win.sibling_slot.shape[2] if win.sibling_slot.dim() == 3 else 0
        if K and win.sibling_slot.shape[1]:
            rows = torch.arange(B, device=device)
            k = j.clamp(max=win.sibling_slot.shape[1] - 1)
            sib = win.sibling_slot[rows, k, picked.clamp(min=0)]
            after = (j + 1).clamp(max=C1)
            slots[rows, after] = torch.where(picked >= 0, sib, slots[rows, after])
        return slots


def room_stats(q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """[..., 2] long: for drafts [...] drawn from q [..., V], whether q has room for siblings (its top mass below
    ONE_HOT, compared in float64 as the host would) and how many ids q has mass on, the draft's excepted."""
    room = (q > 0).sum(-1) - (q.gather(-1, drafts[..., None])[..., 0] > 0).long()
    return torch.stack([(q.amax(-1).double() < ONE_HOT).long(), room], -1)


def tree_tests(
    p: torch.Tensor,
    chain_slot: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor,
    n_drafts: torch.Tensor,
    has_sibling: torch.Tensor,
    siblings: torch.Tensor,
    sibling_slot: torch.Tensor,
    sibling_q: torch.Tensor | None,
    u_accept: torch.Tensor,
    u_sibling: torch.Tensor,
    u_final: torch.Tensor,
    u_bonus: torch.Tensor,
    u_bonus_accept: torch.Tensor,
    branches: int,
    branch_depth: int,
) -> tuple[torch.Tensor, ...]:
    """The tree's verification, pure tensor work (compile=true compiles it into one graph, sjd.decoders.kernels).

    The chain's drafts are tested left to right (p at the chain's slots of the tree's p [B, T, V]); at the first
    rejection, within the first `branch_depth` positions, the rejected draft's siblings by recursive rejection
    sampling: drawn without replacement from its q (`verify_siblings`), or each from its own q (`sibling_q`,
    sjd.core.verify.recursive_rejection). Returns the accepted lengths, the chain's test outcomes, the token
    after them (a sample of what the target leaves), the accepted sibling (-1: none), that sibling's own p, the
    token after it (`bonus_after_sibling`) and p at the chain's slots [B, C+1, V]."""
    B, C, device = p.shape[0], drafts.shape[1], p.device
    rows = torch.arange(B, device=device)
    p_chain = p[rows[:, None], chain_slot]  # [B, C+1, V]
    accepted, n_acc = accepted_prefix(accept_tests(p_chain, drafts, q, u_accept), n_drafts)
    # Target at the first rejection: p minus the chain draft's q (p itself at the bonus slot).
    p_at, q_at, has_draft = stop_slot(p_chain, q, n_acc, n_drafts)
    target = residual(p_at, q_at)
    picked = torch.full((B,), -1, dtype=torch.long, device=device)
    sib_p = target  # the accepted sibling's own next-token distribution (read only where one is)
    if branches > 1 and branch_depth:
        k = n_acc.clamp(max=branch_depth - 1)
        present = has_sibling[rows, k] & ((n_acc < branch_depth) & has_draft)[:, None]
        chain_draft = drafts[rows, n_acc.clamp(max=max(C - 1, 0))] if C else torch.zeros_like(n_acc)
        candidates = siblings[rows, k]
        if sibling_q is None:
            picked, target = verify_siblings(target, q_at, chain_draft, candidates, present, u_sibling)
        else:
            # each drawn on its own from its q: recursive rejection over independent drafts is exact
            picked, target = recursive_rejection(target, candidates, sibling_q[rows, k], present, u_sibling)
        sib_p = p[rows, sibling_slot[rows, k, picked.clamp(min=0)]]
    next_token = sample_from(target, u_final)
    bonus = bonus_after_sibling(sib_p, drafts, q, n_drafts, n_acc + 1, u_bonus, u_bonus_accept)
    return n_acc, accepted, next_token, picked, sib_p, bonus, p_chain


def bonus_after_sibling(
    sib_p: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor,
    n_drafts: torch.Tensor,
    slot: torch.Tensor,
    u_bonus: torch.Tensor,
    u_bonus_accept: torch.Tensor,
) -> torch.Tensor:
    """The token after an accepted sibling, distributed as the sibling's own p: the chain's carried
    draft for that position (`slot`) is tested against it (kept if u * q(d) < p(d), else a residual sample).
    Sampling p afresh would be as exact, but the drafts after it were drawn given that carried
    draft; keeping it when p allows keeps them in step, which saves forwards."""
    B, C = drafts.shape
    if C == 0:
        return sample_from(sib_p, u_bonus)
    rows = torch.arange(B, device=sib_p.device)
    has = slot < n_drafts
    d, q_d = drafts[rows, slot.clamp(max=C - 1)], q[rows, slot.clamp(max=C - 1)] * has[:, None]
    kept = has & accept_tests(sib_p[:, None], d[:, None], q_d[:, None], u_bonus_accept[:, None])[:, 0]
    return torch.where(kept, d, sample_from(residual(sib_p, q_d), u_bonus))


def draw_tree_uniforms(
    generators: Sequence[torch.Generator], n_drafts: list[int], C: int, K1: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """Per row from its own generator, sized by its own window only (batch independence): one draw of
    [accept: c][jacobi: c + 1][sibling: K1][final, bonus, bonus_accept], laid out for the batch in a few gathers."""
    draws = [torch.rand(2 * c + 1 + K1 + 3, generator=g, device=device) for g, c in zip(generators, n_drafts)]
    u = torch.nn.utils.rnn.pad_sequence(draws, batch_first=True)  # [B, longest draw]
    c = torch.tensor(n_drafts)[:, None]
    j = torch.arange(C + 1)[None]

    def take(index: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        index, present = to_device(index.clamp(max=u.shape[1] - 1), device), to_device(present, device)
        return torch.where(present, u.gather(1, index), 0.0)

    ends = 2 * c + 1 + K1 + torch.arange(3)[None]
    return {
        "accept": take((j[:, :C]).expand(len(draws), -1), j[:, :C] < c),
        "jacobi": take(c + j, j <= c),
        "sibling": take(2 * c + 1 + torch.arange(K1)[None], torch.ones(len(draws), K1, dtype=torch.bool)),
        **dict(zip(("final", "bonus", "bonus_accept"), take(ends, ends >= 0).unbind(1))),
    }


def draw_siblings(
    q: torch.Tensor, chain_drafts: torch.Tensor, count: int, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """An ordered draw of `count` ids without replacement from q [D, V] minus each chain draft
    [D] (Gumbel-top-k with `uniforms` [D, V]); returns ids [D, count] and which exist [D, count]
    (fewer when q has fewer ids left)."""
    rest = q.scatter(1, chain_drafts[:, None], 0.0)
    gumbel = -(-uniforms.clamp(1e-20, 1 - 1e-7).log()).log()
    score, ids = (rest.log() + gumbel).topk(count, dim=1)
    return ids, score > float("-inf")


def verify_siblings(
    target: torch.Tensor,
    q: torch.Tensor,
    chain_draft: torch.Tensor,
    siblings: torch.Tensor,
    present: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling over the siblings of a rejected chain draft.

    `target` [B, V] is norm(max(0, p - q)) after the chain draft's rejection, `q` [B, V] the
    distribution chain draft and siblings were drawn from, `siblings` [B, K-1] in draw order,
    `present` [B, K-1], `uniforms` [B, K-1]. Sibling i was drawn from q_i = q without the chain
    draft and siblings before it, renormalised; it is accepted iff u * q_i(s) < target(s), and
    on rejection target <- norm(max(0, target - q_i)). Returns the accepted sibling's index
    (-1: none) and the target left, whose sample is then distributed as the original p."""
    B = target.shape[0]
    rows = torch.arange(B, device=target.device)
    picked = torch.full((B,), -1, dtype=torch.long, device=target.device)
    pool = q.scatter(1, chain_draft[:, None], 0.0)
    for i in range(siblings.shape[1]):
        open_ = present[:, i] & (picked < 0)
        q_i = pool / pool.sum(-1, keepdim=True).clamp_min(1e-30)
        s = siblings[:, i]
        ok = open_ & (uniforms[:, i] * q_i[rows, s] < target[rows, s])
        picked = torch.where(ok, i, picked)
        still = (open_ & ~ok)[:, None]
        target = torch.where(still, residual(target, q_i), target)
        pool = torch.where(still, pool.scatter(1, s[:, None], 0.0), pool)
    return picked, target
