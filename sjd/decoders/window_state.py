"""What a window decoder keeps per row across iterations (`WindowState`), and the per-row uniforms of one
iteration (`draw_uniforms`). The loop that uses them is sjd.decoders.window."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from sjd.core.staging import device_ints
from sjd.core.verify import VerifyResult
from sjd.decoders.base import DecodeResult, ForwardClock


@dataclass
class WindowState:
    """Per row: the output buffer, how much is committed, and the drafts carried past it."""

    tokens: torch.Tensor  # [B, N]
    committed: list[int]
    previous: list[int]  # committed before the last commit (0 before the prefill's token)
    carried: list[torch.Tensor]  # drafts for positions committed[b], committed[b] + 1, ...
    carried_q: list[torch.Tensor]  # ... and the distributions they were drawn from
    accepted: list[list[int]]
    n_forward: list[int]
    last_p: list[torch.Tensor | None]  # the distribution the last committed token was drawn from
    noise: torch.Tensor | None = None  # per-position coupling noise of coupled decoders [B, N, V]
    committed_p: torch.Tensor | None = None  # [B, K, V]: p of the last K committed positions, at pos % K
    inputs: list[int] | None = None  # window inputs forwarded after the prefill (the forwards' compute)
    drafter_forwards: torch.Tensor | None = None  # [B] a trained drafter's forwards per row (sjd.decoders.drafted)
    head_forwards: list[int] | None = None  # draft-head calls per row (sjd.decoders.headed) ...
    heads: int = 0  # ... each running this many heads
    read_counts: Callable[[torch.Tensor], list[int]] = torch.Tensor.tolist  # brings per-row counts to the host
    # Per row, one entry a carried draft, kept in step with `carried`: whether its q has room for siblings (is not
    # one-hot) and how many ids it has mass on besides the draft. SJD-PAC's window plan reads it on the host
    # (sjd.decoders.sjd_pac); None for the decoders that do not.
    carried_room: list[list[tuple[bool, int]]] | None = None

    @classmethod
    def empty(cls, B: int, N: int, V: int, device: torch.device, keep_p: int = 0) -> WindowState:
        return cls(
            tokens=torch.empty(B, N, dtype=torch.long, device=device),
            committed=[1] * B,
            previous=[0] * B,
            carried=[torch.empty(0, dtype=torch.long, device=device)] * B,
            carried_q=[torch.empty(0, V, device=device)] * B,
            accepted=[[1] for _ in range(B)],
            n_forward=[1] * B,
            last_p=[None] * B,
            committed_p=torch.zeros(B, keep_p, V, device=device) if keep_p else None,
            inputs=[0] * B,
        )

    def remember_p(self, b: int, start: int, p: torch.Tensor) -> None:
        """Keep p [k, V] of row b's positions start .. start+k-1 (when the decoder asked for them)."""
        if self.committed_p is None:
            return
        K = self.committed_p.shape[1]
        first = max(start, start + len(p) - K)  # only the last K can still be needed
        slots = torch.arange(first, start + len(p), device=self.committed_p.device) % K
        self.committed_p[b, slots] = p[first - start :]

    def commit(
        self,
        result: VerifyResult,
        drafts: torch.Tensor,
        samples: torch.Tensor,
        p: torch.Tensor,
        widths: list[int],
        samples_q: torch.Tensor | None = None,
        end_row: Callable[[int, int, int], int] | None = None,
        n_accepted: list[int] | None = None,
        room: list[list[tuple[bool, int]]] | None = None,
    ) -> None:
        """Accepted drafts + the next token; the later samples carry over with their q, which is
        p unless a coupled decoder says otherwise (one host sync). `widths[b]` is how many window
        slots of row b hold samples (0: the row is complete). `end_row(b, n, n_accepted)` writes
        what follows row b's accepted drafts and returns how many tokens the forward commits in
        all (default `end_with_next_token`); the branching decoder commits a sibling there. `n_accepted`:
        `result.n_accepted` already read to the host (with what else the caller needed in the same copy); `room`:
        per row, the sibling room of each slot's sample, read in that copy too (kept as `carried_room`)."""
        samples_q = p if samples_q is None else samples_q
        if n_accepted is None:
            n_accepted = self.read_counts(result.n_accepted)
        live = [b for b, width in enumerate(widths) if width]
        self.write_accepted(live, n_accepted, drafts, p)
        for b in live:
            n, n_acc = self.committed[b], n_accepted[b]
            if end_row is None:
                take = self.end_with_next_token(b, n, n_acc, result.next_token[b], p[b, n_acc])
            else:
                take = end_row(b, n, n_acc)
            self.previous[b], self.committed[b] = n, n + take
            self.carried[b], self.carried_q[b] = samples[b, take : widths[b]], samples_q[b, take : widths[b]]
            if self.carried_room is not None:
                self.carried_room[b] = room[b][take : widths[b]]
            self.accepted[b].append(take)
            self.n_forward[b] += 1
            self.inputs[b] += widths[b]

    def write_accepted(self, live: list[int], n_accepted: list[int], drafts: torch.Tensor, p: torch.Tensor) -> None:
        """Each live row's accepted drafts into its tokens, and their p and the next token's into `committed_p`
        (what `remember_p` keeps, row by row), in one indexed write each for the batch."""
        rows, columns, sources = [], [], []
        for b in live:
            n, n_acc = self.committed[b], n_accepted[b]
            rows += [b] * n_acc
            columns += range(n, n + n_acc)
            sources += range(n_acc)
        if rows:
            r, j, c = (device_ints(values, drafts.device) for values in (rows, sources, columns))
            self.tokens[r, c] = drafts[r, j]
        if self.committed_p is None:
            return
        K = self.committed_p.shape[1]
        rows, slots, sources = [], [], []
        for b in live:
            n, end = self.committed[b], self.committed[b] + n_accepted[b] + 1
            first = max(n, end - K)  # only the last K can still be needed
            rows += [b] * (end - first)
            slots += [pos % K for pos in range(first, end)]
            sources += range(first - n, end - n)
        r, j, k = (device_ints(values, self.committed_p.device) for values in (rows, sources, slots))
        self.committed_p[r, k] = p[r, j]

    def finish(self, clock: ForwardClock) -> DecodeResult:
        """The call's result, with each row's window inputs in its extras."""
        result = clock.finish(self.tokens, self.n_forward, self.accepted)
        result.extras["window_inputs"] = list(self.inputs)
        if self.drafter_forwards is not None:
            result.extras["drafter_forwards"] = self.drafter_forwards.tolist()
        if self.head_forwards is not None:
            result.extras["head_forwards"] = list(self.head_forwards)
            result.extras["heads"] = [self.heads] * len(self.head_forwards)
        return result

    def end_with_next_token(self, b: int, n: int, n_acc: int, token: torch.Tensor, p: torch.Tensor) -> int:
        """The usual end of a commit: the residual (or bonus) token after the accepted drafts, drawn from p."""
        self.tokens[b, n + n_acc] = token
        self.last_p[b] = p  # the residual's source; its arg-max is what sample_horizon wants
        return n_acc + 1


@dataclass
class Redraft:
    """Drafts a continuation (a trained drafter's, draft heads') drew after a commit to replace carried ones: [B, K]
    and their q [B, K, V]; `room`: where the state keeps `carried_room`, theirs on the host."""

    drafts: torch.Tensor
    q: torch.Tensor
    room: list[list[tuple[bool, int]]] | None = None


def room_rows(values: Sequence[int], B: int, K: int) -> list[list[tuple[bool, int]]]:
    """[B, K, 2] (has room, ids with mass) read to the host as a flat list -> per row, a pair per draft."""
    return [[(bool(values[2 * (b * K + k)]), values[2 * (b * K + k) + 1]) for k in range(K)] for b in range(B)]


def draw_uniforms(
    generators: Sequence[torch.Generator], widths: list[int], W: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, `widths[b]` uniforms for acceptance (+ the residual/bonus draw) and as many for
    the Jacobi samples, padded to W. Each row draws only what its own window needs, so its
    random stream, and hence its tokens, do not depend on the other rows of the batch."""
    empty = torch.zeros(0, 2, device=device)
    draws = [torch.rand(2, w, generator=g, device=device).T if w else empty for g, w in zip(generators, widths)]
    u = torch.nn.utils.rnn.pad_sequence(draws, batch_first=True)  # [B, max width, 2]
    u = torch.nn.functional.pad(u, (0, 0, 0, W - u.shape[1])).permute(2, 0, 1).contiguous()
    return u[0], u[1]
