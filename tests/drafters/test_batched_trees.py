"""The batched draft trees and tree verification (sjd/drafters/tree.py, sjd/core/tree_verify.py, the LANTERN node
test in sjd/core/relaxed_rules.py) equal, bit for bit, a straightforward implementation kept here as the reference:
trees grown node by node with a dictionary per node, a descent that tests the current node level by level, and a
node test that reads every candidate's neighbours in its own step. On the toy model's shipped drafter at fixed
seeds: the same tokens, tables and q for every shape, with absent nodes (past the image's end, and ids without
mass under a top-k filter), and the same accepted paths and next tokens on random targets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from sjd.core.relaxed_rules import RESIDUAL_EPS, code_neighbours, grammar_fallback, lantern_tree_rule
from sjd.core.sampling import SamplingConfig, sample_from
from sjd.core.seeding import make_generators
from sjd.core.tree_verify import ancestors, sample_and_descend, walk_tree
from sjd.core.verify import recursive_rejection, without_replacement_q
from sjd.drafters.checkpoint import load_drafter
from sjd.drafters.drafter import DrafterRun
from sjd.drafters.tree import STATIC_SHAPES, candidates, child_q, draw_chain, grow
from sjd.harness.prompts import load_prompt_file

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[2]
DRAFTER = str(ROOT / "sjd/assets/drafter_toy")


# -- the reference: trees node by node ------------------------------------------------------------------
def reference_expand(run, parent_hidden, tokens, gen_pos, scratch_slot, sees_scratch, committed):
    """The drafter on tree nodes at generated `gen_pos` [B, K] (-1: padding), their mask built for this call."""
    device = tokens.device
    positions = torch.where(run.to_rows(gen_pos) >= 0, run.slot_of(gen_pos), -1)
    slots = torch.where(positions >= 0, run.length + run.to_rows(scratch_slot), run.dump)
    last = run.slot_of(committed[:, None])
    keys = torch.arange(run.length, device=device)
    mask = (keys[None, None, :] <= last[:, :, None]).expand(-1, tokens.shape[1], -1)
    tail = torch.zeros(run.rows, tokens.shape[1], 1, dtype=torch.bool, device=device)
    mask = torch.cat([mask, run.to_rows(sees_scratch), tail], dim=2)
    mask = mask | (positions < 0)[..., None] & run.dump_only(mask.shape[2], device)
    return run.run(run.to_rows(tokens), parent_hidden, positions, slots, mask)


class ReferenceGrowth:
    def __init__(self, run, root_pos, top_k, children, generators):
        self.run, self.root_pos, self.k, self.children, self.generators = run, root_pos, top_k, children, generators
        self.B, self.V, self.N = len(root_pos), run.layout.vocab_size, run.layout.n_tokens

    def draw(self, q, gen_pos):
        uniforms = None
        if self.children == "sampled":
            uniforms = torch.stack([torch.rand(q.shape[1:], generator=g) for g in self.generators])
        ids, score = candidates(q, self.k, self.children, uniforms)
        return ids, torch.where(((gen_pos >= 0) & (gen_pos < self.N))[..., None], score, float("-inf"))

    def tables(self, tokens, parent, depth, present, q_at: dict) -> dict:
        """Children by rank among the present siblings, found by comparing every pair of nodes."""
        B, n = tokens.shape
        children = torch.full((B, n, self.k), -1, dtype=torch.long)
        for b in range(B):
            for i in range(n):
                kids = [j for j in range(n) if present[b, j] and parent[b, j] == i]
                children[b, i, : min(len(kids), self.k)] = torch.tensor(kids[: self.k], dtype=torch.long)
        node_q = torch.zeros(B, n, self.V)
        for node, q in q_at.items():  # in insertion order: a later write wins
            node_q[torch.arange(B), node] = q
        parent = torch.where(present, parent, -1)
        mask = ancestors(parent) & present[:, None, :] & present[:, :, None]
        return dict(tokens=tokens, parent=parent, depth=depth, present=present, children=children, mask=mask,
                    node_q=node_q)  # fmt: skip


class ReferenceDynamic(ReferenceGrowth):
    def __init__(self, run, root_pos, depth, top_k, total_tokens, children, generators):
        super().__init__(run, root_pos, top_k, children, generators)
        self.depth, self.total = depth, total_tokens

    def monotone(self, score):
        return score.cummin(-1).values if self.children == "sampled" else score

    def build(self) -> dict:
        run, B, K = self.run, self.B, self.k
        rows = torch.arange(B)
        first_pos = self.root_pos + 1
        q_root = run.q(run.h_last[:, None], first_pos[:, None])
        ids, score = self.draw(q_root, first_pos[:, None])
        tok, par, dep, sc = [ids[:, 0]], [torch.full((B, K), -1)], [torch.ones(B, K)], [self.monotone(score[:, 0])]
        q_of = {"root": q_root[:, 0]}
        front = torch.arange(K).expand(B, K)
        front_h = run.h_last[:, None].expand(-1, K, -1)
        sees = torch.cat([torch.eye(K, dtype=torch.bool).expand(B, K, K),
                          torch.zeros(B, K, K * self.depth - K, dtype=torch.bool)], 2)  # fmt: skip
        made = K
        for step in range(self.depth):
            gen_pos = first_pos[:, None] + step
            front_tok = torch.cat(tok, 1)[rows[:, None], front]
            front_score = torch.cat(sc, 1)[rows[:, None], front]
            alive = front_score > float("-inf")
            h = reference_expand(run, front_h, front_tok, torch.where(alive, gen_pos.expand(-1, K), -1),
                                 step * K + torch.arange(K).expand(B, K), sees, self.root_pos)  # fmt: skip
            q = run.q(h, (gen_pos + 1).expand(-1, K))
            q_of[step] = (front, q)
            ids, score = self.draw(q, (gen_pos + 1).expand(-1, K))
            score = front_score[..., None] + self.monotone(score)
            tok.append(ids.flatten(1))
            par.append(front[..., None].expand(-1, -1, K).flatten(1))
            dep.append(torch.full((B, K * K), step + 2.0))
            sc.append(score.flatten(1))
            best = score.flatten(1).topk(K, dim=1).indices
            front = made + best
            made += K * K
            if step + 1 < self.depth:
                front_h = h.gather(1, run.to_rows(best // K)[..., None].expand(-1, -1, h.shape[-1]))
                sees = sees.gather(1, (best // K)[..., None].expand(-1, -1, sees.shape[2])).clone()
                sees[:, torch.arange(K), (step + 1) * K + torch.arange(K)] = True
        return self.select(torch.cat(tok, 1), torch.cat(par, 1), torch.cat(dep, 1).long(), torch.cat(sc, 1), q_of)

    def select(self, tok, par, dep, score, q_of) -> dict:
        B, M = tok.shape
        keep_n = min(self.total - 1, M)
        kept = torch.sort(torch.sort(-score, dim=1, stable=True).indices[:, :keep_n], dim=1).values
        present = score.gather(1, kept) > float("-inf")
        new_index = torch.full((B, M), -1, dtype=torch.long)
        new_index.scatter_(1, kept, torch.arange(1, keep_n + 1).expand(B, -1))
        parent_cand = par.gather(1, kept)
        parent = torch.where(parent_cand < 0, 0, new_index.gather(1, parent_cand.clamp(min=0)))
        present &= parent >= 0
        n = keep_n + 1
        q_at = {torch.zeros(B, dtype=torch.long): q_of["root"]}
        for step in range(self.depth):
            front, q = q_of[step]
            for f in range(front.shape[1]):
                node = new_index.gather(1, front[:, f : f + 1])[:, 0]
                q_at[torch.where(node >= 0, node, n)] = q[:, f]  # a dropped node writes a spare row
        tree = self.tables(
            torch.cat([torch.zeros(B, 1, dtype=torch.long), tok.gather(1, kept)], 1),
            torch.cat([torch.full((B, 1), -1), parent], 1),
            torch.cat([torch.zeros(B, 1, dtype=torch.long), dep.gather(1, kept)], 1),
            torch.cat([torch.ones(B, 1, dtype=torch.bool), present], 1),
            {},
        )
        node_q = torch.zeros(B, n + 1, self.V)
        for node, q in q_at.items():
            node_q[torch.arange(B), node] = q
        tree["node_q"] = node_q[:, :n]
        return tree


class ReferenceStatic(ReferenceGrowth):
    def __init__(self, run, root_pos, shape, top_k, children, generators):
        super().__init__(run, root_pos, top_k, children, generators)
        self.paths = sorted(STATIC_SHAPES[shape], key=lambda p: (len(p), p))

    def build(self) -> dict:
        run, B = self.run, self.B
        index = {(): 0, **{tuple(p): i + 1 for i, p in enumerate(self.paths)}}
        n = len(index)
        tokens, score = torch.zeros(B, n, dtype=torch.long), torch.zeros(B, n)
        parent, depth = torch.full((B, n), -1, dtype=torch.long), torch.zeros(B, n, dtype=torch.long)
        for path, i in index.items():
            if path:
                parent[:, i], depth[:, i] = index[path[:-1]], len(path)
        internal = {p[:-1] for p in map(tuple, self.paths)}
        q_at: dict = {}
        hidden_of, sees_of = {(): run.h_last}, {(): torch.zeros(B, run.scratch, dtype=torch.bool)}
        next_slot = 0
        for level in range(max(len(p) for p in self.paths)):
            expand = sorted(p for p in internal if len(p) == level)
            if level:
                nodes = [index[p] for p in expand]
                slots = list(range(next_slot, next_slot + len(expand)))
                next_slot += len(expand)
                sees = torch.stack([sees_of[p[:-1]] for p in expand], 1).clone()
                for j, s in enumerate(slots):
                    sees[:, j, s] = True
                alive = score[:, nodes] > float("-inf")
                gen_pos = torch.where(alive, (self.root_pos + level)[:, None].expand(-1, len(nodes)), -1)
                parent_h = torch.stack([hidden_of[p[:-1]] for p in expand], 1)
                h = reference_expand(run, parent_h, tokens[:, nodes], gen_pos, torch.tensor(slots).expand(B, -1),
                                     sees, self.root_pos)  # fmt: skip
                for j, p in enumerate(expand):
                    hidden_of[p], sees_of[p] = h[:, j], sees[:, j]
            h_level = torch.stack([hidden_of[p] for p in expand], 1)
            gen_pos = (self.root_pos + level + 1)[:, None].expand(-1, len(expand))
            q = run.q(h_level, gen_pos)
            ids, s = self.draw(q, gen_pos)
            for j, p in enumerate(expand):
                q_at[torch.full((B,), index[p])] = q[:, j]
                for path in self.paths:
                    if tuple(path[:-1]) == p:
                        i = index[tuple(path)]
                        tokens[:, i] = ids[:, j, path[-1]]
                        alive = score[:, index[p]] > float("-inf")
                        score[:, i] = torch.where(alive, s[:, j, path[-1]], float("-inf"))
        present = score > float("-inf")
        present[:, 0] = True
        return self.tables(tokens, parent, depth, present, q_at)


# -- the reference: descent level by level, the LANTERN test candidate by candidate -----------------------
def reference_walk(p, tokens, children, candidate_q, accept_uniforms, sample_uniforms, rule):
    """`candidate_q(node [B], kids [B, K]) -> [B, K, V]`; the current node's test at each level."""
    B = p.shape[0]
    levels = accept_uniforms.shape[1]
    rows = torch.arange(B)
    current = torch.zeros(B, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool)
    path = torch.full((B, levels + 1), -1, dtype=torch.long)
    path[:, 0] = 0
    n_accepted, next_token, next_p = torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long), p[:, 0]
    for level in range(levels):
        target, kids = p[rows, current], children[rows, current]
        present = (kids >= 0) & ~done[:, None]
        safe = kids.clamp(min=0)
        picked, left = rule(target, tokens[rows[:, None], safe], candidate_q(current, kids), present,
                            accept_uniforms[:, level])  # fmt: skip
        stops = ~done & (picked < 0)
        next_token = torch.where(stops, sample_from(left, sample_uniforms[:, level]), next_token)
        next_p = torch.where(stops[:, None], target, next_p)
        moves = ~done & (picked >= 0)
        current = torch.where(moves, safe[rows, picked.clamp(min=0)], current)
        n_accepted += moves.long()
        path[:, level + 1] = torch.where(moves, current, -1)
        done |= stops
    return path, n_accepted, next_token, next_p, done.all()


def reference_without_replacement_q(q, drawn):
    pool, out = q, []
    for i in range(drawn.shape[1]):
        out.append(pool / pool.sum(-1, keepdim=True).clamp_min(1e-30))
        pool = pool.scatter(1, drawn[:, i : i + 1], 0.0)
    return torch.stack(out, 1) if out else q.new_zeros(q.shape[0], 0, q.shape[1])


def reference_lantern_rule(target, cands, candidate_q, present, uniforms, *, neighbours, k, delta=None, lam=None,
                           zero_in="p"):  # fmt: skip
    B, K = cands.shape
    rows = torch.arange(B)
    fallback = grammar_fallback(target, neighbours.free)
    picked = torch.full((B,), -1, dtype=torch.long)
    for i in range(K):
        open_ = present[:, i] & (picked < 0)
        c, q_i = cands[:, i], candidate_q[:, i]
        nb, there = neighbours.of(c, k + 1)
        p_x = target[rows, c]  # the credit: the longest prefix of neighbour mass within the bound
        cum = (target.gather(1, nb[:, :k]) * there[:, :k]).cumsum(1)
        bound = torch.full_like(p_x, delta) if lam is None else (lam - 1) * p_x
        n_within = ((cum <= bound[:, None]) & there[:, :k]).sum(1)
        has_j = n_within > 0
        credit = cum.gather(1, (n_within - 1).clamp(min=0)[:, None]).squeeze(1) if cum.shape[1] else p_x * 0
        ok = open_ & (uniforms[:, i] * q_i[rows, c] < p_x + torch.where(has_j, credit, 0.0))
        picked = torch.where(ok, i, picked)
        hit = torch.zeros_like(target, dtype=torch.bool).scatter_(1, nb, there & has_j[:, None])
        t, q_cut = (target.masked_fill(hit, 0.0), q_i) if zero_in == "p" else (target, q_i.masked_fill(hit, 0.0))
        left = (t - q_cut).clamp_min(0)
        mass = left.sum(1, keepdim=True)
        left = torch.where(mass > RESIDUAL_EPS, left / mass.clamp_min(RESIDUAL_EPS), fallback)
        target = torch.where((open_ & ~ok)[:, None], left, target)
    return picked, target


# -- the toy's drafter ------------------------------------------------------------------------------------
SHAPES = {  # shape, children, depth, top_k, total_tokens
    "dynamic_top_k": ("dynamic", "top_k", 4, 10, 40),
    "dynamic_sampled": ("dynamic", "sampled", 3, 6, 20),
    "mc_sim_7b_63": ("mc_sim_7b_63", "sampled", 0, 10, 26),
    "naive_extend_57": ("naive_extend_57", "top_k", 0, 10, 58),
}
FILTERS = {"full": {}, "top_2": {"top_k": 2}}  # a top-k filter leaves most ids without mass: dead candidates


def toy_sampling(**change) -> SamplingConfig:
    """conf/model/toy.yaml's sampling, with `change`."""
    return dataclasses.replace(SamplingConfig(cfg_scale=3.0, temperature=1.0), **change)


def start_run(toy, sampling: SamplingConfig, scratch: int) -> DrafterRun:
    """The drafter after three prompts' prefill, each row at its own length."""
    prompts = load_prompt_file(ROOT / "sjd/assets/prompts/toy.tsv")[:3]
    features = toy.prefill(prompts, sampling.uses_uncond).features
    run = DrafterRun(load_drafter(toy, DRAFTER), toy, sampling, len(prompts), scratch)
    free = toy.layout.free_tokens.nonzero().flatten()
    run.start(features, free[torch.tensor([0, 5, 9])])
    return run


def scratch_of(shape: str, depth: int, top_k: int) -> int:
    if shape == "dynamic":
        return depth * top_k
    return len({tuple(p[:-1]) for p in STATIC_SHAPES[shape]} - {()})


@pytest.fixture(scope="module")
def grown(toy):
    """(reference tree, batched tree) per shape and filter, the batched one grown after the reference on the same
    drafter state, each with fresh generators of seed 7; and under (shape, filter, "left") the next draws of both
    sets of generators after the growth."""
    N = toy.layout.n_tokens
    root_pos = torch.tensor([3, 90, N - 3])  # the last row's nodes from depth 3 on lie past the image
    out = {}
    with torch.no_grad():
        for name, (shape, children, depth, top_k, total) in SHAPES.items():
            for f, change in FILTERS.items():
                run = start_run(toy, toy_sampling(**change), scratch_of(shape, depth, top_k))

                ref_gens, gens = (make_generators(7, ["a", "b", "c"], torch.device("cpu")) for _ in range(2))
                if shape == "dynamic":
                    ref = ReferenceDynamic(run, root_pos, depth, top_k, total, children, ref_gens).build()
                else:
                    ref = ReferenceStatic(run, root_pos, shape, top_k, children, ref_gens).build()
                out[name, f] = ref, grow(run, root_pos, shape, depth, top_k, total, children, gens)
                out[name, f, "left"] = [torch.stack([torch.rand(3, generator=g) for g in x]) for x in (ref_gens, gens)]
    return out


@pytest.mark.parametrize("f", FILTERS)
@pytest.mark.parametrize("name", SHAPES)
def test_a_tree_grown_level_by_level_in_batched_steps_is_the_node_by_node_one(grown, name, f):
    ref, tree = grown[name, f]
    for field in ("tokens", "parent", "depth", "present", "children", "mask", "node_q"):
        assert torch.equal(getattr(tree, field), ref[field]), field
    # a sampled tree draws each row's uniforms at once: its generators are left where the level-by-level draws are
    assert torch.equal(*grown[name, f, "left"])
    assert (~tree.present).any() and (tree.present.sum(1) > 1).all()  # absent nodes, and a tree in every row


def random_targets(shape: tuple[int, ...], V: int, seed: int) -> torch.Tensor:
    """Targets with about a third of the ids without mass (so that residuals empty and fallbacks are drawn)."""
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(*shape, V, generator=g)
    logits = logits.masked_fill(torch.rand(*shape, V, generator=g) < 0.35, float("-inf"))
    logits[..., 0] = logits[..., 0].clamp(min=-10)  # never every id without mass
    return logits.softmax(-1)


def rules(toy, children: str) -> dict:
    nb = code_neighbours(toy.code_embeddings(), toy.layout.free_tokens, 4)
    lantern = {"neighbours": nb, "k": 3}
    if children == "top_k":
        return {"eagle": sample_and_descend, "lantern": lambda *a: lantern_tree_rule(*a, **lantern, delta=0.1),
                "lantern_k0": lambda *a: lantern_tree_rule(*a, neighbours=nb, k=0, delta=0.1)}  # fmt: skip
    return {"eagle_sampled": recursive_rejection,
            "lantern_pp": lambda *a: lantern_tree_rule(*a, **lantern, lam=5.0, zero_in="q"),
            "lantern_pp_p": lambda *a: lantern_tree_rule(*a, **lantern, lam=20.0, zero_in="p")}  # fmt: skip


def reference_rules(toy, children: str) -> dict:
    nb = code_neighbours(toy.code_embeddings(), toy.layout.free_tokens, 4)
    lantern = {"neighbours": nb, "k": 3}
    if children == "top_k":
        return {"eagle": sample_and_descend, "lantern": lambda *a: reference_lantern_rule(*a, **lantern, delta=0.1),
                "lantern_k0": lambda *a: reference_lantern_rule(*a, neighbours=nb, k=0, delta=0.1)}  # fmt: skip
    return {"eagle_sampled": recursive_rejection,
            "lantern_pp": lambda *a: reference_lantern_rule(*a, **lantern, lam=5.0, zero_in="q"),
            "lantern_pp_p": lambda *a: reference_lantern_rule(*a, **lantern, lam=20.0, zero_in="p")}  # fmt: skip


@pytest.mark.parametrize("name", SHAPES)
def test_the_batched_descent_is_the_level_by_level_one(toy, grown, name):
    """Every node's test at once, then the path from the accepted children: the same path, accepted length, next
    token and its p as testing the current node level by level, for EAGLE's and LANTERN's rules."""
    children = SHAPES[name][1]
    tree = grown[name, "top_2"][1]
    B, N, K = tree.children.shape
    V = tree.vocab_size
    rows = torch.arange(B)
    drawn = children == "sampled"

    def q_of(node, kids):
        ids = tree.tokens[rows[:, None], kids.clamp(min=0)]
        return reference_without_replacement_q(tree.node_q[rows, node], ids) if drawn else \
            torch.nn.functional.one_hot(ids, V).float()  # fmt: skip

    levels = int(tree.depth.max()) + 1
    new_rules, old_rules = rules(toy, children), reference_rules(toy, children)
    accepted = 0
    for seed in range(3):
        p = random_targets((B, N), V, seed)
        g = torch.Generator().manual_seed(100 + seed)
        accept_u, sample_u = torch.rand(B, levels, K, generator=g), torch.rand(B, levels, generator=g)
        for rule in new_rules:
            walk = walk_tree(p, tree.tokens, tree.children, tree.depth, tree.mask, child_q(tree, drawn), accept_u,
                             sample_u, new_rules[rule])  # fmt: skip
            path, n_accepted, next_token, next_p, complete = reference_walk(
                p, tree.tokens, tree.children, q_of, accept_u, sample_u, old_rules[rule]
            )
            assert bool(walk.complete) and bool(complete)
            assert torch.equal(walk.path, path) and torch.equal(walk.n_accepted, n_accepted), rule
            assert torch.equal(walk.next_token, next_token) and torch.equal(walk.next_p, next_p), rule
            accepted += int(n_accepted.sum())
            short = walk_tree(p, tree.tokens, tree.children, tree.depth, tree.mask, child_q(tree, drawn),
                              accept_u[:, :1], sample_u[:, :1], new_rules[rule])  # fmt: skip
            ref_short = reference_walk(p, tree.tokens, tree.children, q_of, accept_u[:, :1], sample_u[:, :1],
                                       old_rules[rule])  # fmt: skip
            assert bool(short.complete) == bool(ref_short[4])  # too few levels: both say so
    assert accepted > 0  # the descents went down the trees


@pytest.mark.parametrize("zero_in", ["p", "q"])
@pytest.mark.parametrize("bound", [{"delta": 0.0}, {"delta": 0.1}, {"lam": 5.0}])
@pytest.mark.parametrize("k", [0, 2, 9])
def test_the_lantern_test_with_its_reads_made_up_front_is_the_candidate_by_candidate_one(toy, zero_in, bound, k):
    """On random targets and top-k or drawn candidates, some absent; k beyond the table's width means all of it."""
    V = toy.layout.vocab_size
    free = toy.layout.free_tokens.nonzero().flatten()
    nb = code_neighbours(toy.code_embeddings(), toy.layout.free_tokens, 6)
    g = torch.Generator().manual_seed(k)
    B, K = 400, 5
    target = random_targets((B,), V, k)
    q0 = random_targets((B,), V, k + 1)
    cands = torch.stack([free[torch.randperm(len(free), generator=g)[:K]] for _ in range(B)])
    cands[: B // 4, 0] = 0  # an id that is not a code: no neighbours
    outcomes = []
    for q in (torch.nn.functional.one_hot(cands, V).float(), without_replacement_q(q0, cands)):
        present = torch.rand(B, K, generator=g) < 0.9
        u = torch.rand(B, K, generator=g)
        args = (target, cands, q, present, u)
        picked, left = lantern_tree_rule(*args, neighbours=nb, k=k, zero_in=zero_in, **bound)
        ref_picked, ref_left = reference_lantern_rule(*args, neighbours=nb, k=k, zero_in=zero_in, **bound)
        assert torch.equal(picked, ref_picked) and torch.equal(left, ref_left)
        outcomes.append(picked)
    assert len(torch.cat(outcomes).unique()) == K + 1  # every candidate accepted somewhere, and none somewhere


def test_draws_without_replacement_all_at_once_are_the_draw_by_draw_ones():
    g = torch.Generator().manual_seed(0)
    for B, K, V in [(7, 4, 58), (300, 10, 58), (5, 0, 10)]:
        q = random_targets((B,), V, B)
        drawn = torch.randint(0, V, (B, K), generator=g)
        assert torch.equal(without_replacement_q(q, drawn), reference_without_replacement_q(q, drawn))


def reference_chain(run, root_pos, length, generators):
    """draw_chain with each row's uniforms drawn position by position, as a one-path tree draws them."""
    B, V = len(root_pos), run.layout.vocab_size
    drafts, q_all = torch.zeros(B, length, dtype=torch.long), torch.zeros(B, length, V)
    hidden, alive, drawn = run.h_last[:, None], torch.ones(B, dtype=torch.bool), None
    root = run.tree_root(root_pos)
    sees = torch.ones(run.scratch, run.scratch, dtype=torch.bool).tril()[:, None, None]
    slots = torch.arange(run.scratch)[:, None]
    for i in range(length):
        if i:
            hidden = run.expand(root, hidden, drawn, i, alive[:, None], slots[i - 1], sees[i - 1])
        position = (root_pos + i + 1)[:, None]
        q = run.q(hidden, position)
        uniforms = torch.stack([torch.rand(q.shape[1:], generator=g) for g in generators])
        ids, score = candidates(q, 1, "sampled", uniforms)
        alive = alive & ((position >= 0) & (position < run.layout.n_tokens))[:, 0] & (score[:, 0, 0] > float("-inf"))
        drawn = ids[:, :, 0]
        drafts[:, i] = torch.where(alive, drawn[:, 0], 0)
        q_all[:, i] = q[:, 0] * alive[:, None]
    return drafts, q_all


@pytest.mark.parametrize("f", FILTERS)
def test_a_chain_drawing_each_rows_uniforms_at_once_is_the_position_by_position_chain(toy, f):
    """draw_chain takes a row's uniforms for the whole chain in one call: the same drafts and q as drawing them a
    position at a time (past the image's end and without mass under a top-k filter too), and each generator left
    where the position-by-position draws leave it."""
    length, root_pos = 5, torch.tensor([3, 90, toy.layout.n_tokens - 3])
    out = []
    with torch.no_grad():
        for chain in (reference_chain, draw_chain):
            run = start_run(toy, toy_sampling(**FILTERS[f]), length - 1)
            gens = make_generators(7, ["a", "b", "c"], torch.device("cpu"))
            out.append((*chain(run, root_pos, length, gens), torch.stack([torch.rand(3, generator=g) for g in gens])))
    for ref, got in zip(*out):
        assert torch.equal(got, ref)
    assert (out[1][0][2, 2:] == 0).all() and (out[1][0][:2] != 0).any()  # a row past the image's end; live rows
