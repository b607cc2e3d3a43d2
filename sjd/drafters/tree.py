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

The growth is a few batched tensor operations per depth, for every row at once: one drafter forward over the
level's nodes, one q, one draw of the candidates of every node of the level, then gathers and scatters that place
them (a top-k over the whole round's candidates for the dynamic tree; index tables made once per static shape and
device, `static_plan`). No step loops over nodes or rows, and none reads a value back to the host, so on a GPU a
tree costs a fixed number of kernel launches whatever its shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from sjd.core.sampling import row_uniforms
from sjd.core.tree_verify import ancestors
from sjd.core.verify import without_replacement_q
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
    mask: torch.Tensor  # [B, N, N] node i sees node j (j is i or one of its ancestors, both present): the target's
    # tree forward's mask, and the ancestor table verification reads the accepted path from
    node_q: torch.Tensor | None  # [B, N, V] q at each node that has children (what they were drawn from), else 0;
    # None where the tree was grown without keeping them (deterministic children are tested with q = 1)
    vocab_size: int = 0


def child_q(tree: DraftTree, drawn: bool) -> torch.Tensor:
    """[B, N, K, V] the distribution each child of each node is tested with: q at the node without the earlier
    draws, renormalised, where the children were `drawn` from it (so `node_q` was kept), else one-hot (q = 1)."""
    B, N, K = tree.children.shape
    ids = tree.tokens.gather(1, tree.children.clamp(min=0).flatten(1)).view(B, N, K)
    if not drawn:
        return torch.nn.functional.one_hot(ids, tree.vocab_size).float()
    return without_replacement_q(tree.node_q.flatten(0, 1), ids.flatten(0, 1)).view(B, N, K, tree.vocab_size)


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
        growth = StaticTree(run, root_pos, shape, top_k, children, generators)
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
    if length > 1:  # a chain of one draft never runs the drafter on a draft
        root = run.tree_root(root_pos)
        # draft i (i >= 1) goes to scratch slot i - 1 and sees the slots of the drafts up to it: row i - 1 of `sees`
        sees = torch.ones(run.scratch, run.scratch, dtype=torch.bool, device=device).tril()[:, None, None]
        slots = torch.arange(run.scratch, device=device)[:, None]
    # Each row's uniforms for the whole chain in one draw: nothing else draws from its generator between the chain's
    # positions, and on the CPU one draw of `length` vectors is the same stream as `length` draws of one
    # (tests/drafters/test_batched_trees.py), so a chain costs one call a row, not one a row and a position.
    uniforms = row_uniforms(generators, device, (length, 1, V))  # [B, length, 1, V]
    drawn = None
    for i in range(length):
        if i:  # the drafter on the draft before
            hidden = run.expand(root, hidden, drawn, i, alive[:, None], slots[i - 1], sees[i - 1])
        position = (root_pos + i + 1)[:, None]
        q = run.q(hidden, position)  # [B, 1, V]
        ids, score = candidates(q, 1, "sampled", uniforms[:, i])
        inside = (position >= 0) & (position < run.layout.n_tokens)
        alive = alive & inside[:, 0] & (score[:, 0, 0] > float("-inf"))
        drawn = ids[:, :, 0]
        drafts[:, i] = torch.where(alive, drawn[:, 0], 0)
        q_all[:, i] = q[:, 0] * alive[:, None]
    return drafts, q_all


class TreeGrowth:
    """What both shapes share: the settings, and the candidate draws."""

    def __init__(self, run: DrafterRun, root_pos: torch.Tensor, top_k: int, children: str, generators) -> None:
        self.run, self.root_pos, self.k, self.children, self.generators = run, root_pos, top_k, children, generators
        self.B, self.V, self.N = len(root_pos), run.layout.vocab_size, run.layout.n_tokens
        self.device = root_pos.device
        self.keep_q = True
        self.uniforms, self.used = None, 0

    def draw_all_uniforms(self, nodes: int) -> None:
        """Sampled children: each row's uniforms for the `nodes` expansions of the whole tree in one draw. Every
        level draws for every row whatever its nodes hold, nothing else draws from a row's generator while its tree
        grows, and on the CPU one draw of `nodes` vectors is the same stream as a draw a level
        (tests/drafters/test_batched_trees.py), so a tree costs one call a row, not one a row and a level."""
        if self.children == "sampled":
            self.uniforms, self.used = row_uniforms(self.generators, self.device, (nodes, self.V)), 0

    def draw(self, q: torch.Tensor, gen_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidates [B, F, k] for q [B, F, V] at generated `gen_pos` [B, F]; -inf past the image."""
        uniforms = None
        if self.children == "sampled":
            F = q.shape[1]
            uniforms, self.used = self.uniforms[:, self.used : self.used + F], self.used + F
        ids, score = candidates(q, self.k, self.children, uniforms)
        inside = (gen_pos >= 0) & (gen_pos < self.N)
        return ids, torch.where(inside[..., None], score, float("-inf"))


class DynamicTree(TreeGrowth):
    """EAGLE-2's tree: each of `depth` rounds runs the drafter on the `top_k` best candidates so far (the front),
    all rows and all front nodes in one forward; the tree keeps the `total_tokens - 1` best candidates made."""

    def __init__(self, run, root_pos, depth, top_k, total_tokens, children, generators) -> None:
        super().__init__(run, root_pos, top_k, children, generators)
        self.depth, self.total = depth, total_tokens

    def build(self) -> DraftTree:
        run, B, K, D, device = self.run, self.B, self.k, self.depth, self.device
        self.draw_all_uniforms(1 + D * K)  # the root, then K front nodes in each of D rounds
        root = run.tree_root(self.root_pos)
        first_pos = self.root_pos + 1
        q_root = run.q(run.h_last[:, None], first_pos[:, None])  # [B, 1, V]
        ids, score = self.draw(q_root, first_pos[:, None])
        # The front: the candidates the next round expands (at first the root's K), by candidate index, token, score.
        front = torch.arange(K, device=device).expand(B, K)
        front_tok, front_score = ids[:, 0], self.monotone(score[:, 0])
        # Every candidate made, in index order: token, parent (a candidate index, -1 = the root), score.
        tok, par, sc = [front_tok], [torch.full((B, K), -1, device=device)], [front_score]
        fronts, qs = [], []
        hidden = run.h_last[:, None].expand(-1, K, -1)  # [R, K, H]: the output at each front node's parent
        # Round s writes front node j to scratch slot s * K + j; a node sees its own slot and its ancestors'.
        slots = torch.arange(D * K, device=device).view(D, K)
        own = torch.eye(D * K, dtype=torch.bool, device=device).view(D, K, D * K)
        sees = own[0].expand(run.rows, K, D * K)
        for step in range(D):
            hidden = run.expand(root, hidden, front_tok, step + 1, front_score > float("-inf"), slots[step], sees)
            gen_pos = (first_pos + step + 1)[:, None].expand(-1, K)
            q = run.q(hidden, gen_pos)  # [B, K, V]
            fronts.append(front)
            qs.append(q)
            ids, score = self.draw(q, gen_pos)  # [B, K, K]: K candidates under each front node
            score = (front_score[..., None] + self.monotone(score)).flatten(1)
            tok.append(ids.flatten(1))
            par.append(front[..., None].expand(-1, -1, K).flatten(1))
            sc.append(score)
            if step + 1 < D:  # the next front: this round's K best candidates, under their parents' outputs
                front_score, best = score.topk(K, dim=1)
                front_tok = tok[-1].gather(1, best)
                front = K + step * K * K + best
                parent = run.to_rows(best // K)[..., None]
                hidden = hidden.gather(1, parent.expand(-1, -1, hidden.shape[-1]))
                sees = sees.gather(1, parent.expand(-1, -1, sees.shape[-1])) | own[step + 1]
        # candidate depths: the root's K at 1, then K * K a round at 2 .. D + 1
        later = torch.arange(2, D + 2, device=device)[:, None].expand(-1, K * K).flatten()
        dep = torch.cat([torch.ones(K, dtype=torch.long, device=device), later]).expand(B, -1)
        kept_q = (q_root[:, 0], torch.cat(fronts, 1), torch.cat(qs, 1)) if self.keep_q else None
        return self.select(torch.cat(tok, 1), torch.cat(par, 1), dep, torch.cat(sc, 1), kept_q)

    def monotone(self, score: torch.Tensor) -> torch.Tensor:
        """Sampled children score no higher than the child drawn before them (prefix-closed selection)."""
        return score.cummin(-1).values if self.children == "sampled" else score

    def select(self, tok, par, dep, score, kept_q) -> DraftTree:
        """The total_tokens - 1 best candidates (ties: the earlier made), in creation order, under the root.
        `kept_q`: (q at the root [B, V], the expanded candidates [B, F], the q at each [B, F, V]) or None."""
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
        node_q = None
        if kept_q is not None:  # each expanded candidate's q to its node; a dropped one's to a spare last row
            q_root, expanded, q = kept_q
            node = new_index.gather(1, expanded)
            at = torch.where(node >= 0, node, n)[..., None].expand(-1, -1, self.V)
            node_q = torch.zeros(B, n + 1, self.V, device=device)
            node_q[:, 0] = q_root
            node_q = node_q.scatter_(1, at, q)[:, :n]
        return self.tables(tokens, parent, depth, present, node_q, self.depth + 1)

    def tables(
        self,
        tokens: torch.Tensor,
        parent: torch.Tensor,
        depth: torch.Tensor,
        present: torch.Tensor,
        node_q: torch.Tensor | None,
        deepest: int,
    ) -> DraftTree:
        """The tree from its nodes in creation order (root first): children in creation (= draw) order, and the
        mask (no node deeper than `deepest`)."""
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
        parent = torch.where(present, parent, -1)
        mask = ancestors(parent, deepest) & present[:, None, :] & present[:, :, None]
        return DraftTree(tokens, parent, depth, present, children, mask, node_q, self.V)


@dataclass(frozen=True)
class StaticLevel:
    """One depth of a static shape: the nodes the drafter expands there, and where their children go."""

    nodes: torch.Tensor  # [F] the level's expanded nodes (the root alone at depth 0)
    parent_at: torch.Tensor  # [F] each one's parent's place in the level above's `nodes`
    slots: torch.Tensor  # [F] their scratch slots (depth >= 1; the root's output is the drafter's h_last)
    sees: torch.Tensor  # [1, F, scratch] the scratch slots each sees: its own and its expanded ancestors'
    child_from: torch.Tensor  # [C] each child of the level's nodes among its draws flattened: f * top_k + rank
    child_node: torch.Tensor  # [C] the node that child is
    child_parent: torch.Tensor  # [C] and its parent node


@dataclass(frozen=True)
class StaticPlan:
    """A static shape's tables, on one device: nodes 0 .. n-1 (the root, then the paths by length and ranks)."""

    parent: torch.Tensor  # [n], -1 at the root
    depth: torch.Tensor  # [n]
    reach: torch.Tensor  # [n, n] node j is node i or one of its ancestors
    children: torch.Tensor  # [n, top_k] each node's children by rank, -1 = none
    levels: tuple[StaticLevel, ...]


@functools.cache
def static_plan(name: str, top_k: int, device: torch.device) -> StaticPlan:
    """The tables of static shape `name` with `top_k` draws a node, made on the host once per device: the tree's
    growth only indexes with them."""
    paths = sorted(map(tuple, check_static_shape(name)), key=lambda p: (len(p), p))
    index = {(): 0, **{p: i + 1 for i, p in enumerate(paths)}}
    parent = [-1] + [index[p[:-1]] for p in paths]
    reach = [[False] * len(index) for _ in index]
    for path, i in index.items():
        for cut in range(len(path) + 1):
            reach[i][index[path[:cut]]] = True
    children = [[-1] * top_k for _ in index]
    for p in paths:
        children[index[p[:-1]]][p[-1]] = index[p]
    internal = {p[:-1] for p in paths}
    scratch = max(1, len(internal - {()}))

    def at(values, dtype=torch.long):
        return torch.tensor(values, dtype=dtype, device=device)

    levels, above, slot_of = [], [()], {}
    for level in range(max(len(p) for p in paths)):
        expand = sorted(p for p in internal if len(p) == level)
        for p in expand:
            if p:
                slot_of[p] = len(slot_of)
        seen = [{slot_of[p[:cut]] for cut in range(1, len(p) + 1)} for p in expand]  # itself and its ancestors
        sees = [[s in slots for s in range(scratch)] for slots in seen]
        kids = [(f * top_k + p[-1], index[p], index[p[:-1]]) for f, e in enumerate(expand) for p in paths
                if p[:-1] == e]  # fmt: skip
        levels.append(StaticLevel(
            nodes=at([index[p] for p in expand]),
            parent_at=at([above.index(p[:-1]) if p else 0 for p in expand]),
            slots=at([slot_of.get(p, 0) for p in expand]),
            sees=at(sees, torch.bool)[None],
            child_from=at([k[0] for k in kids]),
            child_node=at([k[1] for k in kids]),
            child_parent=at([k[2] for k in kids]),
        ))  # fmt: skip
        above = expand
    return StaticPlan(at(parent), at([len(p) for p in index]), at(reach, torch.bool), at(children), tuple(levels))


class StaticTree(TreeGrowth):
    """A static shape: level by level, the drafter runs on the level's expanded nodes (one forward for all rows
    and all of them), and the ranks the shape lists of each one's draws become its children."""

    def __init__(self, run, root_pos, shape, top_k, children, generators) -> None:
        super().__init__(run, root_pos, top_k, children, generators)
        most = max(max(p) for p in check_static_shape(shape))
        if most >= top_k:
            raise ValueError(f"the static tree uses child ranks up to {most}, decoder.top_k={top_k}")
        self.shape = shape

    def build(self) -> DraftTree:
        run, B, device = self.run, self.B, self.device
        plan = static_plan(self.shape, self.k, device)
        self.draw_all_uniforms(sum(len(at.nodes) for at in plan.levels))
        n = len(plan.parent)
        root = run.tree_root(self.root_pos)
        tokens = torch.zeros(B, n, dtype=torch.long, device=device)
        score = torch.zeros(B, n, device=device)  # log q along each node's path; -inf: absent (the root: 0)
        node_q = torch.zeros(B, n, self.V, device=device) if self.keep_q else None
        hidden = run.h_last[:, None]  # [R, F, H]: the drafter's output at each node of the level
        for level, at in enumerate(plan.levels):
            if level:  # the drafter on this level's nodes, under their parents' outputs
                alive = score[:, at.nodes] > float("-inf")
                hidden = run.expand(root, hidden[:, at.parent_at], tokens[:, at.nodes], level, alive, at.slots,
                                    at.sees)  # fmt: skip
            gen_pos = (self.root_pos + level + 1)[:, None].expand(-1, len(at.nodes))
            q = run.q(hidden, gen_pos)  # [B, F, V]
            ids, s = self.draw(q, gen_pos)
            # the listed ranks of each node's draws are its children; a dropped parent drops its subtree
            tokens[:, at.child_node] = ids.flatten(1)[:, at.child_from]
            alive = score[:, at.child_parent] > float("-inf")
            score[:, at.child_node] = torch.where(alive, s.flatten(1)[:, at.child_from], float("-inf"))
            if node_q is not None:
                node_q[:, at.nodes] = q
        # The shape fixes the tables: its children less the absent ones, and its ancestors among the present nodes
        # (an absent node's subtree is absent).
        present = score > float("-inf")
        kids = plan.children.expand(B, -1, -1)
        there = present.gather(1, kids.clamp(min=0).flatten(1)).view_as(kids) & (kids >= 0)
        mask = plan.reach & present[:, None, :] & present[:, :, None]
        parent = torch.where(present, plan.parent, -1)
        return DraftTree(tokens, parent, plan.depth.expand(B, n), present, torch.where(there, kids, -1), mask, node_q,
                         self.V)  # fmt: skip
