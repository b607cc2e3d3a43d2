"""Fresh draft tokens for speculative Jacobi windows, with their (one-hot) draft distributions.

A fresh draft is a deterministic function of the generator and of tokens already known, so
its draft distribution is a point mass q = onehot(x): verification then accepts it with
probability p(x), and on rejection resamples from p without x (docs/algorithms.md §11.2).

Schemes (SJD paper; docs/algorithms.md §4.3):
- random:     a uniformly random id from the model's free image tokens;
- horizontal: repeat the token to the left in the same row;
- vertical:   repeat the token above (the paper's best; absent from the official code);
- sample_horizon: the arg-max of the distribution the token to the left was drawn from (its
  logits' top-1, as the official code's `sample_horizon`), when the decoder knows it; drafts
  further right, whose left neighbour is itself a fresh draft, repeat it (horizontal).
- vertical_dist: where the position above is committed, a fresh draw from the distribution its
  token was drawn from (q = that distribution, so the test accepts with sum(min(p, q)) rather
  than p(token above)); elsewhere vertical. Ours: on textured regions the code above is one
  sample of a spread p, and the code below is another; copying it matches only when the same
  code comes up twice. With Gumbel coupling the draw uses the position's own Gumbel vector, so
  it is the code the position will take if its p equals the one above. Coupled and SJD
  decoders only (it needs the committed p, which the decoder keeps: `distribution_drafts`).
A spatial scheme with no neighbour to copy (first column / first row) falls back to the other
spatial neighbour, then to random. Positions the grammar forces (begin/end of image, size
tokens, end-of-line) always get the forced token: p is one-hot there, so it is accepted with
probability 1 instead of being rejected with certainty.
"""

from __future__ import annotations

import torch

from sjd.types import ImageLayout

SCHEMES = ("random", "horizontal", "vertical", "sample_horizon")
DISTRIBUTION_SCHEMES = ("vertical_dist",)  # need the committed p (distribution_drafts)


def fresh_drafts(
    scheme: str,
    known: torch.Tensor,
    start: int,
    count: int,
    layout: ImageLayout,
    generator: torch.Generator,
    left_distribution: torch.Tensor | None = None,
    force: bool = True,
) -> torch.Tensor:
    """Draft ids for positions start .. start+count-1 of one row.

    `known` [>= start] holds the row's current tokens (committed, then carried drafts) for
    every position before `start`; only spatial schemes read it. `left_distribution`
    [V] is the distribution position start-1 was drawn from (for sample_horizon). `force=False`
    drafts grammar-forced positions like any other (only for the forced-draft ablation)."""
    if scheme not in SCHEMES:
        raise ValueError(f"decoder.init must be one of {SCHEMES}, got {scheme!r}")
    device = known.device
    free_ids = layout.free_ids(device)
    random_ids = free_ids[torch.randint(len(free_ids), (count,), generator=generator, device=device)]
    if scheme == "random" or count == 0:
        out = random_ids
    else:
        seq = torch.cat([known[:start], torch.empty(count, dtype=torch.long, device=device)])
        spatial = "horizontal" if scheme == "sample_horizon" else scheme
        for i in range(count):  # sequential: a draft may copy the draft just before it
            pos = start + i
            seq[pos] = _spatial(spatial, seq, pos, layout, random_ids[i])
        if scheme == "sample_horizon" and left_distribution is not None and code_column(start, layout) > 0:
            seq[start] = left_distribution.argmax()
            for pos in range(start + 1, start + count):  # the rest of the row follows its left neighbour
                seq[pos] = _spatial(spatial, seq, pos, layout, random_ids[pos - start])
        out = seq[start:]
    if not force:
        return out
    forced = layout.forced_on(device)[start : start + count]
    return torch.where(forced >= 0, forced, out)


def distribution_drafts(
    known: torch.Tensor,
    start: int,
    count: int,
    layout: ImageLayout,
    generator: torch.Generator,
    committed: int,
    committed_p: torch.Tensor,
    noise: torch.Tensor | None = None,
    force: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vertical_dist drafts for positions start .. start+count-1 of one row, and their q [count, V].

    `committed_p` [row_stride, V] holds, at pos % row_stride, the distribution position pos was
    committed from, for the row_stride positions below `committed` (the only ones a fresh
    position, at or after `committed`, can have above it). `noise` [N + 1, V]: the row's Gumbel
    vectors under Gumbel coupling (the draw is argmax(log q + g_pos)); else `generator` draws."""
    device, V = known.device, layout.vocab_size
    free_ids = layout.free_ids(device)
    random_ids = free_ids[torch.randint(len(free_ids), (count,), generator=generator, device=device)]
    seq = torch.cat([known[:start], torch.empty(count, dtype=torch.long, device=device)])
    q = torch.zeros(count, V, device=device)
    forced = layout.forced[start : start + count].tolist()  # the layout's own host tensor: reading it stalls nothing
    for i in range(count):  # sequential: a draft may copy the draft just above it
        pos, above = start + i, start + i - layout.row_stride
        column = code_column(pos, layout)
        is_forced = force and forced[i] >= 0
        if is_forced or not (0 <= column < layout.width and layout.first_code <= above < committed):
            seq[pos] = forced[i] if is_forced else _spatial("vertical", seq, pos, layout, random_ids[i])
            q[i, seq[pos]] = 1.0
            continue
        q[i] = committed_p[above % layout.row_stride]
        if noise is not None:
            seq[pos] = (q[i].log() + noise[pos]).argmax()
        else:
            seq[pos] = torch.multinomial(q[i], 1, generator=generator)[0]
    return seq[start:], q


def code_column(pos: int, layout: ImageLayout) -> int:
    """The column of generated position `pos` in the token stream's rows (width for an end-of-line slot), or -1
    before the first code."""
    return (pos - layout.first_code) % layout.row_stride if pos >= layout.first_code else -1


def _spatial(scheme: str, seq: torch.Tensor, pos: int, layout: ImageLayout, fallback: torch.Tensor) -> torch.Tensor:
    neighbour = spatial_neighbour(scheme, pos, layout)
    return fallback if neighbour is None else seq[neighbour]


def spatial_neighbour(scheme: str, pos: int, layout: ImageLayout) -> int | None:
    """The position whose token a `horizontal` or `vertical` draft at `pos` copies (left first, or above first), or
    None where it has neither, or `pos` is no image code slot: the draft is then its random fallback (a forced token
    overrides it anyway)."""
    rel = pos - layout.first_code
    row, col = divmod(rel, layout.row_stride)
    if rel < 0 or col >= layout.width:
        return None
    left = pos - 1 if col > 0 else None
    above = pos - layout.row_stride if row > 0 else None
    if scheme == "horizontal":
        return left if left is not None else above
    return above if above is not None else left


def one_hot(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(tokens, vocab_size).float()
