"""The tree rules are exact, and the ratio rule on top-k children is not: checked on synthetic trees with
hundreds of thousands of rows at once (walk_tree is vectorised over rows), against the known target."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from sjd.core.tree_verify import ancestors, sample_and_descend, walk_tree
from sjd.core.verify import recursive_rejection, without_replacement_q

ROWS = 200_000
V = 5


def kid_tokens(tokens, children):
    """[B, N, K] the token of each child (the root's, 0, where there is none)."""
    B, N, K = children.shape
    return tokens.gather(1, children.clamp(min=0).flatten(1)).view(B, N, K)


def one_hot_q(tokens, children):
    return torch.nn.functional.one_hot(kid_tokens(tokens, children), V).float()


def shape_of(parent: list[int], rows: int):
    """depth [B, N] and the ancestor table [B, N, N] of the tree with `parent` (-1 at the root), in every row."""
    depth = [0]
    for i in parent[1:]:
        depth.append(depth[i] + 1)
    return torch.tensor(depth).expand(rows, -1), ancestors(torch.tensor(parent).expand(rows, -1))


def tree_of_two_levels(root_children: torch.Tensor, grandchild: torch.Tensor):
    """Root (node 0) with children 1 .. k (tokens `root_children` [B, k]); node 1 has one child (token
    `grandchild` [B]) at node k + 1. Returns tokens, children, depth and the ancestor table."""
    B, k = root_children.shape
    n = k + 2
    tokens = torch.zeros(B, n, dtype=torch.long)
    tokens[:, 1 : k + 1], tokens[:, k + 1] = root_children, grandchild
    children = torch.full((B, n, k), -1, dtype=torch.long)
    children[:, 0] = torch.arange(1, k + 1)
    children[:, 1, 0] = k + 1
    return (tokens, children, *shape_of([-1] + [0] * k + [1], B))


def first_two(walk, tokens):
    """The first committed token and the second, per row."""
    rows = torch.arange(tokens.shape[0])
    first = torch.where(walk.n_accepted >= 1, tokens[rows, walk.path[:, 1].clamp(min=0)], walk.next_token)
    second = torch.where(
        walk.n_accepted >= 2,
        tokens[rows, walk.path[:, 2].clamp(min=0)],
        torch.where(walk.n_accepted == 1, walk.next_token, -1),
    )
    return first, second


def p_table(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(2 * torch.randn(n, V, generator=g, dtype=torch.float64), -1).float()


def fits(counts: np.ndarray, p: torch.Tensor) -> float:
    expected = p.double().numpy()
    return chisquare(counts, counts.sum() * expected / expected.sum()).pvalue


@pytest.mark.parametrize("children", ["top_k", "sampled"])
def test_descending_a_tree_commits_tokens_distributed_as_the_target(children):
    g = torch.Generator().manual_seed(0)
    ps = p_table(1, V + 1)  # ps[0]: p after the root; ps[1 + x]: p after a first token x
    q = p_table(2, 1)[0]  # the drafter's q at the root: far from ps[0]
    k = 3
    if children == "top_k":
        kids = q.topk(k).indices.expand(ROWS, k)
    else:  # an ordered draw without replacement, fresh for every row
        gumbel = -(-torch.rand(ROWS, V, generator=g).log()).log()
        kids = (q.log() + gumbel).topk(k, dim=1).indices
    grand = ps[1 + kids[:, 0]].argmax(-1)
    tokens, tree_children, depth, reach = tree_of_two_levels(kids, grand)
    n = tokens.shape[1]
    p = torch.empty(ROWS, n, V)
    p[:, 0] = ps[0]
    p[:, 1 : k + 1] = ps[1 + kids]
    p[:, k + 1] = 0.2  # after the grandchild: any p (uniform)
    q_of = one_hot_q(tokens, tree_children)
    if children == "sampled":  # the root's children were drawn from q; node 1's one child is fixed
        q_of[:, 0] = without_replacement_q(q.expand(ROWS, V), kids)
    u = torch.rand(ROWS, 3, k, generator=g)
    tree = (p, tokens, tree_children, depth, reach, q_of)
    walk = walk_tree(*tree, u, torch.rand(ROWS, 3, generator=g))
    assert bool(walk.complete)
    short = walk_tree(*tree, u[:, :1], torch.rand(ROWS, 1, generator=g))
    assert not bool(short.complete)  # one level cannot finish a row whose root child is accepted
    first, second = first_two(walk, tokens)
    counts = np.bincount(first.numpy(), minlength=V)
    assert fits(counts, ps[0]) > 1e-3
    for x in range(V):  # given an accepted first child x, the next token is distributed as p after x
        rows_x = (first == x) & (walk.n_accepted >= 1)
        if rows_x.sum() < 1000:
            continue
        c = np.bincount(second[rows_x].numpy(), minlength=V)
        assert fits(c, ps[1 + x]) > 1e-3, (children, x)
    assert (walk.n_accepted >= 1).float().mean() > 0.3  # the tree is used


def test_the_ratio_rule_on_top_k_children_is_biased():
    """EAGLE-1's rule u < p(x) / q(x) with a deterministic arg-max child: p = (.5, .5), q = (.6, .4) gives
    P(first = x) = 5/6, not 1/2."""
    p0 = torch.tensor([0.5, 0.5])
    q = torch.tensor([0.6, 0.4])
    g = torch.Generator().manual_seed(0)
    target = p0.expand(ROWS, 2)
    cands = torch.zeros(ROWS, 1, dtype=torch.long)  # arg-max of q
    present = torch.ones(ROWS, 1, dtype=torch.bool)
    u = torch.rand(ROWS, 1, generator=g)
    picked, left = recursive_rejection(target, cands, q.expand(ROWS, 1, 2), present, u)
    out = torch.where(picked >= 0, 0, torch.multinomial(left, 1, generator=g)[:, 0])
    assert (out == 0).float().mean().item() == pytest.approx(5 / 6, abs=0.005)
    picked, left = recursive_rejection(target, cands, torch.nn.functional.one_hot(cands, 2).float(), present, u)
    out = torch.where(picked >= 0, 0, torch.multinomial(left, 1, generator=g)[:, 0])
    assert (out == 0).float().mean().item() == pytest.approx(0.5, abs=0.005)  # q = 1: exact


def test_ancestor_mask_holds_each_node_its_path():
    parent = torch.tensor([[-1, 0, 0, 1, 3, -1]])
    mask = ancestors(parent)[0]
    assert mask[4].nonzero().flatten().tolist() == [0, 1, 3, 4]
    assert mask[2].nonzero().flatten().tolist() == [0, 2]
    assert mask[5].nonzero().flatten().tolist() == [5]  # an absent node sees itself only


def test_ancestor_mask_reaches_the_root_of_deep_chains_and_random_trees():
    """Against a walk up the parents written out: a chain of 64 (as deep as a tree of 64 nodes gets) and random
    trees with absent nodes, batched."""
    g = torch.Generator().manual_seed(0)
    chain = torch.arange(-1, 63)[None]  # node i's parent is i - 1
    trees = torch.stack([torch.tensor([-1] + [int(torch.randint(i, (1,), generator=g)) for i in range(1, 40)])
                         for _ in range(5)])  # fmt: skip
    trees[:, 30:] = -1  # absent nodes
    for parent in (chain, trees):
        expected = torch.zeros(parent.shape[0], parent.shape[1], parent.shape[1], dtype=torch.bool)
        for b, row in enumerate(parent.tolist()):
            for i in range(len(row)):
                j = i
                while j >= 0:
                    expected[b, i, j] = True
                    j = row[j]
        assert torch.equal(ancestors(parent), expected)


def test_without_replacement_q_removes_earlier_draws():
    q = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    out = without_replacement_q(q, torch.tensor([[0, 2]]))
    assert torch.allclose(out[0, 0], q[0])
    assert torch.allclose(out[0, 1], torch.tensor([0.0, 0.5, 1 / 3, 1 / 6]))


def test_one_draw_descent_is_eagle_2s_rule_in_distribution():
    """sample_and_descend accepts child x with probability p(x) and leaves p without the children, as recursive
    rejection with one-hot q does; absent children change nothing."""
    g = torch.Generator().manual_seed(3)
    p = p_table(4, 1).expand(ROWS, V)
    cands = torch.tensor([[3, 1, 0]]).expand(ROWS, 3)
    present = torch.tensor([[True, True, False]]).expand(ROWS, 3)
    outcomes = []
    for rule in (sample_and_descend, recursive_rejection):
        picked, left = rule(
            p, cands, torch.nn.functional.one_hot(cands, V).float(), present, torch.rand(ROWS, 3, generator=g)
        )
        out = torch.where(
            picked >= 0,
            cands.gather(1, picked.clamp(min=0)[:, None])[:, 0],
            torch.multinomial(left, 1, generator=g)[:, 0],
        )
        outcomes.append(np.bincount(out.numpy(), minlength=V))
        stopped = left[picked < 0]
        assert (stopped[:, [1, 3]] == 0).all() and (stopped[:, 0] > 0).all()  # id 0 is an absent child: kept
    for counts in outcomes:
        assert fits(counts, p[0]) > 1e-3


def test_a_value_pruned_sampled_tree_is_not_exact_and_eagle_refuses_it():
    """Recursive rejection needs the kept children to be chosen without looking at their values. A dynamic
    tree keeps a sampled child only if its own score passes a cut: with p = (.5, 0, 0, .5), q = (.2, .4, .4, 0)
    and two ordered draws, the second kept only if q(x2) >= 0.8 q(x1), token 0 is committed with probability
    1/3, not 1/2 (exactly, by enumeration; here by walk_tree on 200,000 rows); keeping both draws, whatever
    their values, commits it with probability 1/2. So the lossless decoders refuse sampled children on a
    dynamic tree at start-up."""
    from sjd.decoders.eagle import EagleDecoder

    g = torch.Generator().manual_seed(0)
    p_root = torch.tensor([0.5, 0.0, 0.0, 0.5])
    q = torch.tensor([0.2, 0.4, 0.4, 0.0])
    gumbel = -(-torch.rand(ROWS, 4, generator=g).log()).log()
    kids = (q.log() + gumbel).topk(2, dim=1).indices  # two ordered draws without replacement, per row
    tokens = torch.zeros(ROWS, 3, dtype=torch.long)
    tokens[:, 1:] = kids
    p = torch.full((ROWS, 3, 4), 0.25)
    p[:, 0] = p_root
    depth, reach = shape_of([-1, 0, 0], ROWS)

    def first_token_share(keep_second: torch.Tensor) -> float:
        children = torch.full((ROWS, 3, 2), -1, dtype=torch.long)
        children[:, 0, 0] = 1
        children[:, 0, 1] = torch.where(keep_second, 2, -1)
        q_of = torch.zeros(ROWS, 3, 2, 4)
        q_of[:, 0] = without_replacement_q(q.expand(ROWS, 4), kids)  # the root's two draws
        u = torch.rand(ROWS, 2, 2, generator=g)
        walk = walk_tree(p, tokens, children, depth, reach, q_of, u, torch.rand(ROWS, 2, generator=g))
        first, _ = first_two(walk, tokens)
        return float((first == 0).float().mean())

    pruned = first_token_share(q[kids[:, 1]] >= 0.8 * q[kids[:, 0]])
    kept = first_token_share(torch.ones(ROWS, dtype=torch.bool))
    se = (0.25 / ROWS) ** 0.5
    assert abs(pruned - 1 / 3) < 5 * se and abs(kept - 1 / 2) < 5 * se, (pruned, kept)

    with pytest.raises(ValueError, match="children=sampled with decoder.tree=dynamic is not exact"):
        EagleDecoder(drafter={"weights": "random"}, tree="dynamic", children="sampled")
    EagleDecoder(drafter={"weights": "random"}, tree="mc_sim_7b_63", total_tokens=26, children="sampled")
