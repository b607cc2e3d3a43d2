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
nothing else. Pure and vectorised over rows and nodes: a fixed number of tensor operations whatever the tree's
shape, the rule's own loop over a node's children aside.
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
    depth: torch.Tensor,
    reach: torch.Tensor,
    candidate_q: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
    rule: NodeRule = recursive_rejection,
) -> TreeWalk:
    """p [B, N, V] at every node, tokens [B, N], children [B, N, K] node indices in test order (-1 = none),
    depth [B, N], reach [B, N, N] (node j is node i or one of its ancestors, as `ancestors` gives it; absent
    nodes may have empty rows), candidate_q [B, N, K, V] the distribution each child of each node was drawn from
    given the ones before it, accept_uniforms [B, L, K] and sample_uniforms [B, L] for levels 0 .. L-1 (L = the
    tree's depth + 1): a node at depth d is tested with the uniforms of level d.

    The descent in batched steps, none of them a loop over depth:
    1. the test of every node at once (the rule over B * N rows), each with its level's uniforms: which child
       it accepts, and the target left where it accepts none. A node's outcome depends on its own p, children and
       uniforms only, not on whether the descent reaches it, so at the nodes the descent visits these are
       the outcomes a walk from the root would get;
    2. the accepted path: the root, and every node that its parent accepted and whose ancestors are all on it;
    3. the next token, drawn at the path's last node from the target left there, with the uniform of its level.
    A node deeper than L - 1 is tested with level L - 1's uniforms, and only a descent that needs more than L
    levels reaches it: `complete` is then false, and the caller raises."""
    B, N, V = p.shape
    levels, K = accept_uniforms.shape[1], children.shape[2]
    device = p.device
    # 1. every node's test
    level = depth.clamp(max=levels - 1)
    uniforms = accept_uniforms.gather(1, level[..., None].expand(-1, -1, K))  # [B, N, K]
    safe = children.clamp(min=0)
    kid_tokens = tokens.gather(1, safe.flatten(1)).view(B, N, K)
    picked, left = rule(
        p.flatten(0, 1), kid_tokens.flatten(0, 1), candidate_q.flatten(0, 1), (children >= 0).flatten(0, 1),
        uniforms.flatten(0, 1),
    )  # fmt: skip
    picked, left = picked.view(B, N), left.view(B, N, V)
    # 2. the path: accepted children (each node has one parent, so one scatter marks them), then the nodes whose
    # whole line of ancestors was accepted
    accepted = torch.where(picked >= 0, safe.gather(2, picked.clamp(min=0)[..., None])[..., 0], N)
    chosen = torch.zeros(B, N + 1, dtype=torch.bool, device=device).scatter_(1, accepted, True)[:, :N]
    chosen[:, 0] = True  # the root
    on_path = chosen & ~(reach & ~chosen[:, None, :]).any(-1)
    n_accepted = on_path.sum(1) - 1
    # path[b, d]: the path's node at depth d, by one scatter into a table with a spare last column where every
    # node off the path lands (so is every node past the levels, which only an incomplete descent has)
    at = torch.where(on_path, depth.clamp(max=levels + 1), levels + 1)
    nodes = torch.arange(N, device=device).expand(B, N)
    path = torch.full((B, levels + 2), -1, dtype=torch.long, device=device)
    path = path.scatter_(1, at, torch.where(on_path, nodes, -1))[:, : levels + 1]
    # 3. the next token, at the path's last node
    last = path.gather(1, n_accepted.clamp(max=levels)[:, None]).clamp(min=0)  # [B, 1]
    stop_u = sample_uniforms.gather(1, n_accepted.clamp(max=levels - 1)[:, None])[:, 0]
    next_token = sample_from(left.gather(1, last[..., None].expand(-1, -1, V))[:, 0], stop_u)
    next_p = p.gather(1, last[..., None].expand(-1, -1, V))[:, 0]
    return TreeWalk(path, n_accepted, next_token, next_p, (n_accepted < levels).all())


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


def ancestors(parent: torch.Tensor, deepest: int | None = None) -> torch.Tensor:
    """[B, N, N] bool: node j is node i or one of its ancestors, from parent [B, N] (-1 for the root and
    for absent nodes, whose row is themselves alone). The closure of "j is i or i's parent" by repeated
    squaring: after k squarings it reaches ancestors up to 2^k steps up, so ceil(log2 d) of them reach all when
    no node is deeper than d (`deepest`, which a caller that grew the tree knows; else N - 1), and the host never
    asks the device how deep the tree is."""
    B, N = parent.shape
    device = parent.device
    reach = torch.eye(N, dtype=torch.bool, device=device).expand(B, N, N).clone()
    has = parent >= 0
    reach |= torch.nn.functional.one_hot(parent.clamp(min=0), N).bool() & has[..., None]
    steps, deepest = 1, N - 1 if deepest is None else deepest
    while steps < deepest:
        step = reach.to(torch.float32)
        reach = torch.bmm(step, step) > 0  # exact: sums of 0/1 products, at most N
        steps *= 2
    return reach
