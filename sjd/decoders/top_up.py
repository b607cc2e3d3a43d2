"""Each row's drafts for its next positions, for the whole batch at once: the drafts it carries, topped up with
fresh ones (sjd.core.drafts says what each scheme drafts), and the q of each.

The per-row functions of sjd.core.drafts draft one row with a few small tensor operations a position. On a batch
of thousands of rows (the exact audits) that costs more than the forward, and on a GPU each is a kernel launch.
Here every fresh draft is planned on the host from positions alone: it is a forced token, a draw from the committed
p above it, a random id, the arg-max of the distribution to its left, or a copy of a token before it, followed to
where the copy chain ends. The batch's drafts are then one gather from one pool. Only what must use a row's own
generator runs row by row, in the order the per-row functions use it: the row's random ids (one call) and, without
Gumbel vectors, its draws from the committed p above (one call a draw, in position order). So every row gets exactly
what `fresh_drafts` / `distribution_drafts` give it alone, and its generator is left in the same state
(tests/decoders/test_top_up.py). The plan's indices go over in non-blocking copies (sjd.core.staging): no value on
the device is read.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sjd.core.drafts import DISTRIBUTION_SCHEMES, SCHEMES, code_column, spatial_neighbour
from sjd.core.staging import device_ints
from sjd.decoders.window_state import WindowState
from sjd.types import ImageLayout


def top_up_rows(
    scheme: str,
    force: bool,
    state: WindowState,
    needs: Sequence[int],
    layout: ImageLayout,
    generators: Sequence[torch.Generator],
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per row b: its first `needs[b]` drafts (the carried ones, then fresh ones of `scheme`) and their q [need, V].
    `force=False` drafts grammar-forced positions like any other (the forced-draft ablation)."""
    if scheme not in SCHEMES + DISTRIBUTION_SCHEMES:
        raise ValueError(f"decoder.init must be one of {SCHEMES + DISTRIBUTION_SCHEMES}, got {scheme!r}")
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    short = []  # rows with fresh drafts to make: (b, carried drafts, their q, first fresh position, how many)
    for b, need in enumerate(needs):
        d, dq = state.carried[b][:need], state.carried_q[b][:need]
        out.append((d, dq))
        if d.shape[0] < need:
            short.append((b, d, dq, state.committed[b] + d.shape[0], need - d.shape[0]))
    if short:
        ids, q = FreshPlan(scheme, force, state, layout).draw(short, generators)
        offset = 0
        for b, d, dq, _, count in short:
            out[b] = (torch.cat([d, ids[offset : offset + count]]), torch.cat([dq, q[offset : offset + count]]))
            offset += count
    return out


class FreshPlan:
    """The short rows' fresh drafts as indices into one pool: [the rows' tokens (flat, n_tokens a row) | the short
    rows' carried drafts | their random ids | the layout's forced ids | late ids], the late ids being the draws from
    the committed p above (vertical_dist) or the arg-maxes of the left distributions (sample_horizon)."""

    def __init__(self, scheme: str, force: bool, state: WindowState, layout: ImageLayout) -> None:
        self.scheme, self.force, self.state, self.layout = scheme, force, state, layout
        self.device = state.tokens.device
        self.distribution = scheme in DISTRIBUTION_SCHEMES
        self.copies = "vertical" if self.distribution or scheme == "vertical" else "horizontal"

    def draw(self, short: list, generators: Sequence[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        """The fresh drafts of every short row, flat in row order [M], and their q [M, V]."""
        state, layout, device = self.state, self.layout, self.device
        free_ids = layout.free_ids(device)
        forced = layout.forced.tolist()  # the layout's own host tensor: reading it stalls nothing
        n_carried = sum(row[1].shape[0] for row in short)
        carried_at = state.tokens.numel()
        random_at = carried_at + n_carried
        self.forced_at = random_at + sum(row[4] for row in short)
        self.late_at = self.forced_at + layout.n_tokens
        sources: list[int] = []  # per fresh draft: its pool index, or -1 - k for the k-th late id
        random_draws: list[torch.Tensor] = []
        self.drawn: list[tuple[int, int, int]] = []  # (row, position, committed_p slot) of each draw, in order
        self.drawn_ids: list[torch.Tensor] = []  # without Gumbel vectors: each draw, made with its row's generator
        self.drawn_flat: list[int] = []  # which fresh drafts are draws (their q is the p above, not one-hot)
        self.lefts: list[torch.Tensor] = []
        for b, d, dq, start, count in short:
            random_draws.append(torch.randint(len(free_ids), (count,), generator=generators[b], device=device))
            row = RowChain(b, state.committed[b], start, layout.n_tokens, carried_at, random_at)
            if self.distribution:
                self.plan_distribution(row, count, forced, generators[b], len(sources))
            else:
                self.plan_spatial(row, count, d, dq)
                if self.force:  # forced tokens replace the drafts at the end, after every copy was made
                    row.final = [self.forced_at + start + i if forced[start + i] >= 0 else s
                                 for i, s in enumerate(row.final)]  # fmt: skip
            sources += row.final
            carried_at += d.shape[0]
            random_at += count
        return self.gather(short, sources, random_draws)

    def plan_distribution(self, row: RowChain, count: int, forced: list[int], generator, flat_at: int) -> None:
        layout, S = self.layout, self.layout.row_stride
        for i in range(count):
            pos, above = row.start + i, row.start + i - S
            column = code_column(pos, layout)
            if self.force and forced[pos] >= 0:
                row.final.append(self.forced_at + pos)
            elif 0 <= column < layout.width and layout.first_code <= above < row.committed:
                self.drawn_flat.append(flat_at + i)
                row.final.append(-1 - len(self.drawn))
                self.drawn.append((row.b, pos, above % S))
                if self.state.noise is None:  # the row's generator draws now: after its random ids, in order
                    q = self.state.committed_p[row.b, above % S].to(torch.get_default_dtype())
                    self.drawn_ids.append(torch.multinomial(q, 1, generator=generator)[0])
            else:
                row.final.append(row.copy_of(spatial_neighbour("vertical", pos, layout), i))

    def plan_spatial(self, row: RowChain, count: int, d: torch.Tensor, dq: torch.Tensor) -> None:
        left = None
        if self.scheme == "sample_horizon":  # the distribution position start - 1 was drawn from
            left = dq[-1] if d.shape[0] else self.state.last_p[row.b]
        from_left = left is not None and code_column(row.start, self.layout) > 0
        for i in range(count):
            if self.scheme == "random":
                row.final.append(row.random_at + i)
            elif i == 0 and from_left:
                row.final.append(-1 - len(self.lefts))
                self.lefts.append(left)
            else:
                row.final.append(row.copy_of(spatial_neighbour(self.copies, row.start + i, self.layout), i))

    def gather(self, short: list, sources: list[int], random_draws: list[torch.Tensor]):
        state, layout, device, V = self.state, self.layout, self.device, self.layout.vocab_size
        random_ids = layout.free_ids(device)[torch.cat(random_draws)]
        pool = [state.tokens.reshape(-1), *[row[1] for row in short], random_ids, layout.forced_on(device)]
        q_drawn = None
        if self.drawn:
            rows, positions, slots = (device_ints(column, device) for column in zip(*self.drawn))
            q_drawn = state.committed_p[rows, slots].to(torch.get_default_dtype())
            if state.noise is not None:  # each position's own Gumbel vector: argmax(log q + g_pos)
                pool.append((q_drawn.log() + state.noise[rows, positions]).argmax(-1))
            else:
                pool.append(torch.stack(self.drawn_ids))
        if self.lefts:
            pool.append(torch.stack([left.argmax() for left in self.lefts]))
        index = [self.late_at - 1 - s if s < 0 else s for s in sources]
        ids = torch.cat(pool)[device_ints(index, device)]
        if not self.distribution:
            return ids, torch.nn.functional.one_hot(ids, V).float()
        q = torch.nn.functional.one_hot(ids, V).to(torch.get_default_dtype())
        if self.drawn:
            q[device_ints(self.drawn_flat, device)] = q_drawn
        return ids, q


class RowChain:
    """One short row's plan: the pool index of each fresh draft so far (`final`), which a later copy follows."""

    def __init__(self, b: int, committed: int, start: int, n_tokens: int, carried_at: int, random_at: int) -> None:
        self.b, self.committed, self.start = b, committed, start
        self.token_at, self.carried_at, self.random_at = b * n_tokens, carried_at, random_at
        self.final: list[int] = []

    def copy_of(self, neighbour: int | None, i: int) -> int:
        """What the i-th fresh draft copies: its neighbour's token (committed, carried, or a fresh draft before it),
        or its own random id where it has none."""
        if neighbour is None:
            return self.random_at + i
        if neighbour >= self.start:
            return self.final[neighbour - self.start]
        if neighbour >= self.committed:
            return self.carried_at + neighbour - self.committed
        return self.token_at + neighbour
