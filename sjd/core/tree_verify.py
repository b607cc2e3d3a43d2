"""Verification of a draft tree: descend from the root while a child is accepted, then draw the next token.

A tree holds, per row, nodes 0 .. N-1 in creation order: node 0 is the root (the last committed token, whose
target output predicts the first drafted position), every other node a drafted token whose parent comes
before it. The target's forward gives p at every node (the distribution of the token after it). From the
root, the children of the current node are tested against p there by `recursive_rejection`
(sjd.core.verify), each with the distribution it was drawn from: an accepted child becomes the current
node, and where none is accepted the next token is drawn from the target left after the rejections. At a
node without children the draw is from p itself (the bonus token). By induction over depth every committed
token is distributed as AR's (docs/algorithms.md §12.4), provided the tree was chosen without the
verification coins and each node's p is exact, which the tree's attention mask (a node sees the committed
tokens, its ancestors and itself) makes it.

`walk_tree` takes the per-node test as an argument, so relaxed rules (LANTERN's) change the test and
nothing else. Pure and vectorised over rows; the loop runs over depth, at most the tree's depth + 1 times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sjd.core.sampling import sample_from
from sjd.core.verify import recursive_rejection

NodeRule = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]
"""(target [B, V], candidates [B, K], candidate_q [B, K, V], present [B, K], uniforms [B, K]) -> (picked [B],
target left [B, V]): `recursive_rejection`'s signature."""


@dataclass
class TreeWalk:
    path: torch.Tensor  # [B, D + 1] nodes on the accepted path, root first; -1 past its end
    n_accepted: torch.Tensor  # [B] drafted tokens accepted (the path's length minus the root)
    next_token: torch.Tensor  # [B] the token after them: a residual sample, or the bonus
    next_p: torch.Tensor  # [B, V] p at the last accepted node (where the next token's slot sits)
    complete: torch.Tensor  # [] bool, on the device: every row stopped within the uniforms' levels (else the
    # levels were fewer than the tree's depth + 1, a caller's error; the caller reads it with its counts)


def walk_tree(
    p: torch.Tensor,
    tokens: torch.Tensor,
    children: torch.Tensor,
    candidate_q: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
    rule: NodeRule = recursive_rejection,
) -> TreeWalk:
    """p [B, N, V] at every node, tokens [B, N], children [B, N, K] node indices in test order (-1 = none),
    `candidate_q(node [B], kids [B, K]) -> [B, K, V]` the distribution each child of `node` was drawn from
    given the ones before it, accept_uniforms [B, L, K] and sample_uniforms [B, L] for levels 0 .. L-1
    (L = the tree's depth + 1)."""
    B, N, _ = p.shape
    levels = accept_uniforms.shape[1]
    device = p.device
    rows = torch.arange(B, device=device)
    current = torch.zeros(B, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    path = torch.full((B, levels + 1), -1, dtype=torch.long, device=device)
    path[:, 0] = 0
    n_accepted = torch.zeros(B, dtype=torch.long, device=device)
    next_token = torch.zeros(B, dtype=torch.long, device=device)
    next_p = p[:, 0]
    for level in range(levels):
        target = p[rows, current]
        kids = children[rows, current]  # [B, K]
        present = (kids >= 0) & ~done[:, None]
        safe = kids.clamp(min=0)
        picked, left = rule(
            target, tokens[rows[:, None], safe], candidate_q(current, kids), present, accept_uniforms[:, level]
        )
        stops = ~done & (picked < 0)
        next_token = torch.where(stops, sample_from(left, sample_uniforms[:, level]), next_token)
        next_p = torch.where(stops[:, None], target, next_p)
        moves = ~done & (picked >= 0)
        current = torch.where(moves, safe[rows, picked.clamp(min=0)], current)
        n_accepted += moves.long()
        path[:, level + 1] = torch.where(moves, current, -1)
        done |= stops
    return TreeWalk(path, n_accepted, next_token, next_p, done.all())


def sample_and_descend(
    target: torch.Tensor,
    candidates: torch.Tensor,
    candidate_q: torch.Tensor,
    present: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The node test for deterministic children, in one draw: y ~ target; the child equal to y is accepted,
    and where none is, the target without the children (renormalised) is left to draw the next token from.
    Distributed exactly as `recursive_rejection` with one-hot q (EAGLE-2's rule: accept the i-th child x iff
    u < p_i(x), else remove x): both accept child x with probability p(x) and emit y outside the children with
    probability p(y). `candidate_q` is not read (a deterministic child's q is one-hot); `uniforms[:, 0]` draws y."""
    y = sample_from(target, uniforms[:, 0])
    match = present & (candidates == y[:, None])
    picked = torch.where(match.any(1), match.long().argmax(1), -1)
    children = torch.zeros_like(target).scatter_add(1, candidates.clamp(min=0), present.to(target.dtype)) > 0
    others = target.masked_fill(children, 0.0)
    mass = others.sum(-1, keepdim=True)
    left = torch.where(mass > 1e-12, others / mass.clamp_min(1e-30), target)
    return picked, left


def ancestors(parent: torch.Tensor) -> torch.Tensor:
    """[B, N, N] bool: node j is node i or one of its ancestors, from parent [B, N] (-1 for the root and
    for absent nodes, whose row is themselves alone). The closure of "j is i or i's parent" by repeated
    squaring: after k squarings it reaches ancestors up to 2^k steps up, so ceil(log2 N) of them reach all,
    and the host never asks the device how deep the tree is."""
    B, N = parent.shape
    device = parent.device
    reach = torch.eye(N, dtype=torch.bool, device=device).expand(B, N, N).clone()
    has = parent >= 0
    reach |= torch.nn.functional.one_hot(parent.clamp(min=0), N).bool() & has[..., None]
    steps = 1
    while steps < N:
        step = reach.to(torch.float32)
        reach = torch.bmm(step, step) > 0  # exact: sums of 0/1 products, at most N
        steps *= 2
    return reach
