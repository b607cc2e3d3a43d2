"""Draft trees from a trained drafter: EAGLE-2's dynamic tree and EAGLE-1's static one.

Both grow the tree level by level from the root (the last committed token): every node chosen for expansion
is run through the drafter once (the nodes of one level in one drafter forward), and from the q at it come
`top_k` candidate children, either
- the top-k of q (`children: top_k`, deterministic, EAGLE-2), or
- an ordered draw of k ids from q without replacement (`children: sampled`, EAGLE-1), with each row's own
  uniforms (Gumbel-top-k), so a row's tree never depends on its batch.

Which candidates stay, and which nodes are expanded, is the shape's:
- `dynamic` (EAGLE-2): a candidate's score is the sum of log q along its path; each of `depth` rounds expands
  the `top_k` best-scored candidates of the round before, and the tree keeps the `total_tokens - 1` best
  candidates of all, with the root. A parent scores at least as high as its child, so the kept set is a tree.
- static `choices` (EAGLE-1's `mc_sim_7b_63`, LANTERN's `naive_extend_57`): a list of paths of candidate
  ranks; every node that a longer path goes through is expanded.

Sampled children are verified by recursive rejection sampling with q minus the earlier draws, which is exact
only when the kept children of a node are the first ones drawn, whatever their values: static shapes keep that
by listing ranks 0 .. c-1 only (checked). A dynamic tree scores each sampled child no higher than the one drawn
before it, so its kept set is a prefix, but whether a child passes the cut depends on its own token: the lossless
decoders refuse that combination (sjd.decoders.eagle); LANTERN, lossy by design, may grow it.
Nothing here looks at the target's verification coins, which is what makes every rule in
sjd.core.tree_verify exact on these trees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sjd.core.tree_verify import ancestors
from sjd.drafters.drafter import DrafterRun

# Published static shapes: paths of child ranks (EAGLE-1's default, and LANTERN's for LlamaGen and Anole).
STATIC_SHAPES: dict[str, list[list[int]]] = {
    "mc_sim_7b_63": [
        [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0], [0, 0, 0], [0, 0, 1],
        [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2],
        [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
    ],
    "naive_extend_57": [
        [0], [1], [2], [3], [4], [0, 0], [0, 1], [0, 2], [0, 3], [1, 0], [1, 1], [1, 2], [2, 0], [2, 1], [2, 2],
        [3, 0], [3, 1], [4, 0], [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 1, 0], [0, 1, 1], [0, 1, 2],
        [0, 2, 0], [0, 2, 1], [0, 2, 2], [0, 3, 0], [0, 3, 1], [1, 0, 0], [1, 0, 1], [1, 1, 0], [2, 0, 0],
        [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 1, 0], [0, 0, 1, 1], [0, 0, 1, 2],
        [0, 0, 2, 0], [0, 0, 2, 1], [0, 0, 3, 0], [0, 1, 0, 0], [0, 1, 0, 1], [0, 1, 1, 0], [0, 2, 0, 0],
        [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1], [0, 0, 1, 0, 0],
        [0, 0, 1, 0, 1], [0, 0, 1, 1, 0], [0, 0, 2, 0, 0],
    ],
}  # fmt: skip
CHILDREN = ("top_k", "sampled")


@dataclass
class DraftTree:
    """Per row, nodes in creation order (a parent before its children); node 0 is the root."""

    tokens: torch.Tensor  # [B, N]
    parent: torch.Tensor  # [B, N], -1 for the root and absent nodes
    depth: torch.Tensor  # [B, N], 0 at the root
    present: torch.Tensor  # [B, N] bool
    children: torch.Tensor  # [B, N, K] node indices in test (draw) order, -1 = none
    node_q: torch.Tensor | None  # [B, N, V] q at each node that has children (what they were drawn from), else 0;
    # None where the tree was grown without keeping them (deterministic children are tested with q = 1)
    vocab_size: int = 0

    @property
    def mask(self) -> torch.Tensor:
        """[B, N, N]: node i sees node j (j is i or one of its ancestors), for the target's tree forward."""
        return ancestors(self.parent) & self.present[:, None, :] & self.present[:, :, None]


def check_static_shape(name: str) -> list[list[int]]:
    if name not in STATIC_SHAPES:
        raise ValueError(f"decoder.tree must be `dynamic` or one of {sorted(STATIC_SHAPES)}, got {name!r}")
    paths = STATIC_SHAPES[name]
    kids: dict[tuple, list[int]] = {}
    for path in paths:
        kids.setdefault(tuple(path[:-1]), []).append(path[-1])
    for parent, ranks in kids.items():
        if sorted(ranks) != list(range(len(ranks))) or (parent and list(parent) not in paths):
            raise ValueError(
                f"static tree {name!r}: the children of {list(parent)} are not ranks 0 .. c-1 of a listed node"
            )
    return paths


def candidates(
    q: torch.Tensor, k: int, children: str, uniforms: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """k candidate ids per distribution q [..., V] and their log q [..., k] (-inf for ids without mass):
    the top-k, or an ordered draw without replacement (Gumbel-top-k with `uniforms` [..., V])."""
    if children == "top_k":
        top, ids = q.topk(k, dim=-1)  # log is monotone: take the top-k first, the log of k values only
        return ids, top.clamp_min(0).log()
    logq = q.clamp_min(0).log()
    gumbel = -(-uniforms.clamp(1e-20, 1 - 1e-7).log()).log()
    perturbed, ids = (logq + gumbel).topk(k, dim=-1)
    score = logq.gather(-1, ids)
    return ids, torch.where(perturbed > float("-inf"), score, float("-inf"))


def grow(
    run: DrafterRun,
    root_pos: torch.Tensor,
    shape: str,
    depth: int,
    top_k: int,
    total_tokens: int,
    children: str,
    generators,
    keep_q: bool = True,
) -> DraftTree:
    """The draft tree after the drafter's catch-up (its `h_last` predicts the position after the root, at
    generated position `root_pos` [B]); a row with root_pos >= n_tokens - 1 gets an empty tree. `keep_q`:
    keep the q at every expanded node (`node_q`, [B, N, V]), which only tests of drawn children read."""
    if shape == "dynamic":
        growth = DynamicTree(run, root_pos, depth, top_k, total_tokens, children, generators)
    else:
        growth = StaticTree(run, root_pos, check_static_shape(shape), top_k, children, generators)
    growth.keep_q = keep_q
    return growth.build()


def draw_chain(run: DrafterRun, root_pos: torch.Tensor, length: int, generators) -> tuple[torch.Tensor, torch.Tensor]:
    """A drafted continuation of every row after its root: `length` tokens, each a sample of the drafter's q
    given the ones before it (drawn with the row's own uniforms), and those q. Returns drafts [B, length] and
    q [B, length, V]; past the image's end a draft is 0 with q = 0.

    The chain a static tree of one path would grow (the same draws, the same drafter forwards), written as its
    own loop: a tree's bookkeeping (node tables, ranks, a q per node) costs kernel launches a GPU pays at every
    drafted position, and a chain needs none of it."""
    B, device, V = len(root_pos), root_pos.device, run.layout.vocab_size
    drafts = torch.zeros(B, length, dtype=torch.long, device=device)
    q_all = torch.zeros(B, length, V, device=device)
    hidden = run.h_last[:, None]  # [R, 1, H]: predicts the position after the root
    alive = torch.ones(B, dtype=torch.bool, device=device)  # the chain so far has mass at every draft
    sees = torch.zeros(B, 1, run.scratch, dtype=torch.bool, device=device)  # the scratch slots of the ancestors
    drawn = None
    for i in range(length):
        if i:  # the drafter on the draft before: its pair goes to scratch slot i - 1
            sees[:, 0, i - 1] = True
            at = torch.where(alive[:, None], (root_pos + i)[:, None], -1)
            slot = torch.full((B, 1), i - 1, dtype=torch.long, device=device)
            hidden = run.expand(hidden, drawn, at, slot, sees.clone(), root_pos)
        position = (root_pos + i + 1)[:, None]
        q = run.q(hidden, position)  # [B, 1, V]
        uniforms = torch.stack([torch.rand(q.shape[1:], generator=g, device=device) for g in generators])
        ids, score = candidates(q, 1, "sampled", uniforms)
        inside = (position >= 0) & (position < run.layout.n_tokens)
        alive = alive & inside[:, 0] & (score[:, 0, 0] > float("-inf"))
        drawn = ids[:, :, 0]
        drafts[:, i] = torch.where(alive, drawn[:, 0], 0)
        q_all[:, i] = q[:, 0] * alive[:, None]
    return drafts, q_all


class TreeGrowth:
    """What both shapes share: candidate draws, the drafter forwards over a level, and the final tables."""

    def __init__(self, run: DrafterRun, root_pos: torch.Tensor, top_k: int, children: str, generators) -> None:
        self.run, self.root_pos, self.k, self.children, self.generators = run, root_pos, top_k, children, generators
        self.B, self.V, self.N = len(root_pos), run.layout.vocab_size, run.layout.n_tokens
        self.device = root_pos.device
        self.keep_q = True

    def draw(self, q: torch.Tensor, gen_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidates [B, F, k] for q [B, F, V] at generated `gen_pos` [B, F]; -inf past the image."""
        uniforms = None
        if self.children == "sampled":
            uniforms = torch.stack([torch.rand(q.shape[1:], generator=g, device=self.device) for g in self.generators])
        ids, score = candidates(q, self.k, self.children, uniforms)
        inside = (gen_pos >= 0) & (gen_pos < self.N)
        return ids, torch.where(inside[..., None], score, float("-inf"))

    def finish(
        self, tokens: torch.Tensor, parent: torch.Tensor, depth: torch.Tensor, present: torch.Tensor, q_at: dict
    ) -> DraftTree:
        """Tables from nodes in creation order (root first): children in creation (= draw) order."""
        B, n = tokens.shape
        index = torch.arange(n, device=self.device)
        same = (
            (parent[:, :, None] == parent[:, None, :])
            & present[:, None, :]
            & (index[None, None, :] < index[None, :, None])
        )
        rank = same.sum(-1)  # earlier present siblings
        K = self.k
        has = present & (parent >= 0) & (rank < K)
        # children[b, parent, rank] = node, by one scatter into a flat table with a spare last slot where every
        # node without a place goes (no host read of how many there are); (parent, rank) pairs are unique
        slot = torch.where(has, parent.clamp(min=0) * K + rank.clamp(max=K - 1), n * K)
        flat = torch.full((B, n * K + 1), -1, dtype=torch.long, device=self.device)
        flat.scatter_(1, slot, torch.where(has, index[None, :].expand(B, n), -1))
        children = flat[:, : n * K].view(B, n, K)
        node_q = None
        if self.keep_q:
            node_q = torch.zeros(B, n, self.V, device=self.device)
            for node, q in q_at.items():  # node index tensor [B] -> q [B, V]
                node_q[torch.arange(B, device=self.device), node] = q
        return DraftTree(tokens, torch.where(present, parent, -1), depth, present, children, node_q, self.V)


class DynamicTree(TreeGrowth):
    def __init__(self, run, root_pos, depth, top_k, total_tokens, children, generators) -> None:
        super().__init__(run, root_pos, top_k, children, generators)
        self.depth, self.total = depth, total_tokens

    def build(self) -> DraftTree:
        run, B, K, device = self.run, self.B, self.k, self.device
        rows = torch.arange(B, device=device)
        first_pos = self.root_pos + 1
        q_root = run.q(run.h_last[:, None], first_pos[:, None])  # [B, 1, V]
        ids, score = self.draw(q_root, first_pos[:, None])
        ids, score = ids[:, 0], self.monotone(score[:, 0])
        # Every candidate ever made: token, parent (candidate index, -1 = root), depth, score.
        tok, par, dep, sc = [ids], [torch.full((B, K), -1, device=device)], [torch.ones(B, K, device=device)], [score]
        q_of = {"root": q_root[:, 0]}
        front = torch.arange(K, device=device).expand(B, K)  # candidate indices being expanded
        front_h = run.h_last[:, None].expand(-1, K, -1)
        sees = torch.eye(K, dtype=torch.bool, device=device).expand(B, K, K)  # scratch slots of ancestors + self
        scratch = K * self.depth
        sees = torch.cat([sees, torch.zeros(B, K, scratch - K, dtype=torch.bool, device=device)], 2)
        made = K
        for step in range(self.depth):
            gen_pos = first_pos[:, None] + step
            front_tok = torch.cat(tok, 1)[rows[:, None], front]
            front_score = torch.cat(sc, 1)[rows[:, None], front]
            alive = front_score > float("-inf")
            h = run.expand(front_h, front_tok, torch.where(alive, gen_pos.expand(-1, K), -1),
                           step * K + torch.arange(K, device=device).expand(B, K), sees, self.root_pos)  # fmt: skip
            q = run.q(h, (gen_pos + 1).expand(-1, K))  # [B, K, V]
            q_of[step] = (front, q)
            ids, score = self.draw(q, (gen_pos + 1).expand(-1, K))  # [B, K, K]
            score = front_score[..., None] + self.monotone(score)
            tok.append(ids.flatten(1))
            par.append(front[..., None].expand(-1, -1, K).flatten(1))
            dep.append(torch.full((B, K * K), step + 2.0, device=device))
            sc.append(score.flatten(1))
            best = score.flatten(1).topk(K, dim=1).indices  # the next round expands these
            parent_slot = best // K
            front = made + best
            made += K * K
            if step + 1 < self.depth:
                front_h = h.gather(1, run.to_rows(parent_slot)[..., None].expand(-1, -1, h.shape[-1]))
                sees = sees.gather(1, parent_slot[..., None].expand(-1, -1, sees.shape[2])).clone()
                sees[:, torch.arange(K, device=device), (step + 1) * K + torch.arange(K, device=device)] = True
        return self.select(torch.cat(tok, 1), torch.cat(par, 1), torch.cat(dep, 1).long(), torch.cat(sc, 1), q_of)

    def monotone(self, score: torch.Tensor) -> torch.Tensor:
        """Sampled children score no higher than the child drawn before them (prefix-closed selection)."""
        return score.cummin(-1).values if self.children == "sampled" else score

    def select(self, tok, par, dep, score, q_of) -> DraftTree:
        """The total_tokens - 1 best candidates (ties: the earlier made), in creation order, under the root."""
        B, M = tok.shape
        device = self.device
        keep_n = min(self.total - 1, M)
        order = torch.sort(-score, dim=1, stable=True).indices[:, :keep_n]  # candidates are made in index order
        kept = torch.sort(order, dim=1).values  # creation order
        present = score.gather(1, kept) > float("-inf")
        new_index = torch.full((B, M), -1, dtype=torch.long, device=device)
        new_index.scatter_(1, kept, torch.arange(1, keep_n + 1, device=device).expand(B, -1))
        parent_cand = par.gather(1, kept)
        parent = torch.where(parent_cand < 0, 0, new_index.gather(1, parent_cand.clamp(min=0)))
        present &= parent >= 0  # a kept child of a dropped parent (possible only through -inf ties) is dropped
        n = keep_n + 1
        tokens = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=device), tok.gather(1, kept)], 1)
        parent = torch.cat([torch.full((B, 1), -1, device=device), parent], 1)
        depth = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=device), dep.gather(1, kept)], 1)
        present = torch.cat([torch.ones(B, 1, dtype=torch.bool, device=device), present], 1)
        q_at = {torch.zeros(B, dtype=torch.long, device=device): q_of["root"]}
        for step in range(self.depth):
            if step not in q_of:
                continue
            front, q = q_of[step]
            for f in range(front.shape[1]):
                node = new_index.gather(1, front[:, f : f + 1])[:, 0]
                q_at[torch.where(node >= 0, node, n)] = q[:, f]  # a dropped node writes the spare row
        keep, self.keep_q = self.keep_q, False
        tree = self.finish(tokens, parent, depth, present, {})
        self.keep_q = keep
        if not keep:
            return tree
        node_q = torch.zeros(B, n + 1, self.V, device=device)
        rows = torch.arange(B, device=device)
        for node, q in q_at.items():
            node_q[rows, node] = q
        tree.node_q = node_q[:, :n]
        return tree


class StaticTree(TreeGrowth):
    def __init__(self, run, root_pos, paths, top_k, children, generators) -> None:
        super().__init__(run, root_pos, top_k, children, generators)
        self.paths = sorted(paths, key=lambda p: (len(p), p))
        if max(max(p) for p in paths) >= top_k:
            raise ValueError(
                f"the static tree uses child ranks up to {max(max(p) for p in paths)}, decoder.top_k={top_k}"
            )

    def build(self) -> DraftTree:
        run, B, device = self.run, self.B, self.device
        index = {(): 0, **{tuple(p): i + 1 for i, p in enumerate(self.paths)}}
        n = len(index)
        tokens = torch.zeros(B, n, dtype=torch.long, device=device)
        score = torch.zeros(B, n, device=device)
        parent = torch.full((B, n), -1, dtype=torch.long, device=device)
        depth = torch.zeros(B, n, dtype=torch.long, device=device)
        for path, i in index.items():
            if path:
                parent[:, i], depth[:, i] = index[path[:-1]], len(path)
        internal = {p[:-1] for p in map(tuple, self.paths)}
        q_at: dict = {}
        levels = max(len(p) for p in self.paths)
        scratch = run.scratch
        hidden_of: dict[tuple, torch.Tensor] = {(): run.h_last}
        slot_of: dict[tuple, int] = {}
        sees_of: dict[tuple, torch.Tensor] = {(): torch.zeros(B, scratch, dtype=torch.bool, device=device)}
        next_slot = 0
        for level in range(levels):
            expand = sorted(p for p in internal if len(p) == level)
            if level:  # run the drafter on this level's internal nodes (the root's output is h_last)
                nodes = [index[p] for p in expand]
                slots = list(range(next_slot, next_slot + len(expand)))
                next_slot += len(expand)
                sees = torch.stack([sees_of[p[:-1]] for p in expand], 1).clone()
                for j, s in enumerate(slots):
                    sees[:, j, s] = True
                alive = score[:, nodes] > float("-inf")
                gen_pos = torch.where(alive, (self.root_pos + level)[:, None].expand(-1, len(nodes)), -1)
                parent_h = torch.stack([hidden_of[p[:-1]] for p in expand], 1)
                h = run.expand(parent_h, tokens[:, nodes], gen_pos,
                               torch.tensor(slots, device=device).expand(B, -1), sees, self.root_pos)  # fmt: skip
                for j, p in enumerate(expand):
                    hidden_of[p], slot_of[p], sees_of[p] = h[:, j], slots[j], sees[:, j]
            h_level = torch.stack([hidden_of[p] for p in expand], 1)
            gen_pos = (self.root_pos + level + 1)[:, None].expand(-1, len(expand))
            q = run.q(h_level, gen_pos)  # [B, F, V]
            ids, s = self.draw(q, gen_pos)
            for j, p in enumerate(expand):
                q_at[torch.full((B,), index[p], device=device)] = q[:, j]
                for path in self.paths:
                    if tuple(path[:-1]) == p:
                        i = index[tuple(path)]
                        tokens[:, i] = ids[:, j, path[-1]]
                        alive = score[:, index[p]] > float("-inf")  # a dropped parent drops its subtree
                        score[:, i] = torch.where(alive, s[:, j, path[-1]], float("-inf"))
        present = score > float("-inf")
        present[:, 0] = True
        return self.finish(tokens, parent, depth, present, q_at)
