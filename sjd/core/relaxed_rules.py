"""Relaxed (lossy) acceptance rules: GSD and LANTERN-style for speculative Jacobi windows, and LANTERN's
own node test for draft trees.

Each accepts a draft x more often than min(1, p(x)/q(x)) by crediting x with the target mass
of image codes "like" x: its nearest neighbours in the image tokenizer's latent space (the
model's `code_embeddings`). They trade exactness for speed; the audit measures how much.

- GSD (grouped speculative decoding, ICCV 2025; docs/algorithms.md §7.1): accept iff
  u * q(G) < p(G) for the group G = {x} + those of x's `neighbours` nearest codes whose
  target probability is close to x's (|p(c) - p(x)| < `p_tol`) and whose target rank is within
  `rank_radius` of x's. On rejection, the residual norm(max(0, p - q)) as in SJD.
  (The released code forms G from the model's input-embedding distances; we use the image
  tokenizer's latents, which every adapter exposes the same way.)
- LANTERN-style (ICLR 2025, training-free variant on SJD's drafts): x's `neighbours` nearest
  codes are added in order of latent distance while the added target mass stays <= `delta`
  (a total-variation budget); accept iff u * q(x) < p(x) + added. On rejection, sample p with
  x and its credited neighbours removed.
- LANTERN / LANTERN++ on a draft tree (`lantern_tree_rule`, for sjd.decoders.lantern): the released
  code's test, with its additive bound `delta` or LANTERN++'s multiplicative bound `lam`, its rejection
  (the first k + 1 neighbours zeroed in p, or in q for its EAGLE-1 rule on LlamaGen and Anole), and a
  zero-mass fallback kept inside the grammar (`grammar_fallback`).

Pure functions, vectorised over batch and window, as sjd.core.verify.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sjd.core.sampling import sample_from
from sjd.core.verify import RESIDUAL_EPS, VerifyResult, accepted_prefix, residual, stop_slot


def neighbour_table(embeddings: torch.Tensor, free: torch.Tensor, k: int) -> torch.Tensor:
    """[V, k] the k nearest other free ids of every id by latent L2 distance (nearest first);
    rows of non-free ids are never read. embeddings [V, D], free [V] bool."""
    free_ids = free.nonzero().flatten()
    k = min(k, len(free_ids) - 1)
    e = embeddings[free_ids].float()
    dist = torch.cdist(e, e)
    dist.fill_diagonal_(float("inf"))
    nearest = free_ids[dist.topk(k, largest=False).indices]  # [n_free, k]
    table = torch.zeros(len(free), k, dtype=torch.long, device=embeddings.device)
    table[free_ids] = nearest
    return table


def gsd_masses(
    p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, table: torch.Tensor, p_tol: float, rank_radius: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group masses p(G), q(G) [B, D] and the group members [B, D, k] (False = not in G)."""
    D = drafts.shape[1]
    p, neighbours = p[:, :D], table[drafts]  # [B, D, V], [B, D, k]
    p_x = p.gather(-1, drafts[..., None])  # [B, D, 1]
    p_n = p.gather(-1, neighbours)
    rank = p.argsort(-1, descending=True).argsort(-1)  # rank of every id under p
    r_x, r_n = rank.gather(-1, drafts[..., None]), rank.gather(-1, neighbours)
    member = ((p_n - p_x).abs() < p_tol) & ((r_n - r_x).abs() <= rank_radius)
    p_group = p_x.squeeze(-1) + (p_n * member).sum(-1)
    q_group = q.gather(-1, drafts[..., None]).squeeze(-1) + (q.gather(-1, neighbours) * member).sum(-1)
    return p_group, q_group, member


def lantern_masses(
    p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, table: torch.Tensor, delta: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Relaxed target p(x) + credited neighbour mass, q(x) [B, D], and the credited set [B, D, k]."""
    D = drafts.shape[1]
    p, neighbours = p[:, :D], table[drafts]
    p_n = p.gather(-1, neighbours)  # nearest first
    credited = p_n.cumsum(-1) <= delta
    p_relaxed = p.gather(-1, drafts[..., None]).squeeze(-1) + (p_n * credited).sum(-1)
    return p_relaxed, q.gather(-1, drafts[..., None]).squeeze(-1), credited


def relaxed_verify(
    p: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor,
    n_drafts: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
    target_mass: torch.Tensor,
    draft_mass: torch.Tensor,
    on_reject: torch.Tensor,
) -> VerifyResult:
    """sjd.core.verify with the test u * draft_mass < target_mass and, at the first rejection, the
    next token drawn from `on_reject` [B, D, V] (the bonus slot still samples p)."""
    accepted, n_accepted = accepted_prefix(accept_uniforms * draft_mass < target_mass, n_drafts)
    p_at, reject_at, rejected = stop_slot(p, on_reject, n_accepted, n_drafts)
    dist = torch.where(rejected[:, None], reject_at, p_at)
    return VerifyResult(n_accepted, sample_from(dist, sample_uniforms), accepted)


def gsd_rejection(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return residual(p[:, : q.shape[1]], q)


def lantern_rejection(
    p: torch.Tensor, drafts: torch.Tensor, table: torch.Tensor, credited: torch.Tensor
) -> torch.Tensor:
    """p without the draft and its credited neighbours, renormalised (p itself if nothing is left)."""
    D = drafts.shape[1]
    full = p[:, :D]
    left = full.clone()
    left.scatter_(-1, drafts[..., None], 0.0)
    left.scatter_(-1, table[drafts], left.gather(-1, table[drafts]) * ~credited)
    mass = left.sum(-1, keepdim=True)
    return torch.where(mass > 1e-12, left / mass.clamp_min(1e-30), full)


# -- LANTERN and LANTERN++ on a draft tree (sjd.decoders.lantern) -------------------------------------
# The rules above credit neighbours on SJD's window; the ones below are the released LANTERN code's node
# test for a draft tree (docs/algorithms.md §7.3), given to sjd.core.tree_verify.walk_tree.
@dataclass(frozen=True)
class CodeNeighbours:
    """The nearest codes of every free id by latent L2 distance (itself excluded, nearest first), `width`
    of them, held compactly: `table` [n_free, width] int16 (int32 past 32767 codes) holds positions in
    `ids` [n_free] (the free ids), and `slot` [V] maps an id to its row (-1 for ids that are not free)."""

    table: torch.Tensor
    ids: torch.Tensor
    slot: torch.Tensor

    @property
    def width(self) -> int:
        return self.table.shape[1]

    @property
    def free(self) -> torch.Tensor:
        """[V] bool: the ids the table covers (the layout's free ids), on the table's device."""
        return self.slot >= 0

    def of(self, x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n neighbours of ids x [B] as ids [B, n] (0 where absent) and whether each is there [B, n]:
        a non-free id has none, and none lies past the table's width."""
        n = min(n, self.width)
        row = self.slot[x]
        found = self.table[row.clamp(min=0), :n].long()
        there = (row >= 0)[:, None].expand(-1, n)
        return torch.where(there, self.ids[found], 0), there


def code_neighbours(embeddings: torch.Tensor, free: torch.Tensor, width: int, chunk: int = 1024) -> CodeNeighbours:
    """The `width` nearest other free ids of every free id (at most all of them), computed on the embeddings'
    device `chunk` rows at a time, so the full distance matrix of a large codebook is never held. Equal
    distances go to the lower id (a stable sort), not to whatever order a top-k kernel leaves them in."""
    device = embeddings.device
    free = free.to(device)
    ids = free.nonzero().flatten()
    n = len(ids)
    width = max(0, min(width, n - 1))
    e = embeddings[ids].float()
    table = torch.empty(n, width, dtype=torch.int16 if n <= 32767 else torch.int32, device=device)
    for start in range(0, n, chunk):
        dist = torch.cdist(e[start : start + chunk], e)
        rows = torch.arange(dist.shape[0], device=device)
        dist[rows, start + rows] = float("inf")  # itself is no neighbour
        table[start : start + chunk] = dist.sort(dim=-1, stable=True).indices[:, :width].to(table.dtype)
    slot = torch.full((len(free),), -1, dtype=torch.long, device=device)
    slot[ids] = torch.arange(n, device=device)
    return CodeNeighbours(table, ids, slot)


def lantern_credit(
    p_x: torch.Tensor,
    near: torch.Tensor,
    there: torch.Tensor,
    delta: float | None = None,
    lam: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LANTERN's relaxed target mass of a draft x whose target mass is `p_x` [B], from the target mass `near`
    [B, k] of x's k nearest codes, nearest first (`there` [B, k] False where absent, a prefix of each row as
    CodeNeighbours.of gives it): c_j = the mass of the first j + 1 neighbours, J = the largest j with
    c_j <= delta (LANTERN, additive) or c_j <= (lam - 1) p(x) (LANTERN++, multiplicative). Returns p(x) + c_J
    (p(x) where no j qualifies) [B] and whether J exists [B]."""
    if (delta is None) == (lam is None):
        raise ValueError("lantern_credit: give exactly one of delta (LANTERN) and lam (LANTERN++)")
    if not near.shape[1]:
        return p_x + 0.0, torch.zeros_like(p_x, dtype=torch.bool)
    cum = (near * there).cumsum(1)  # never decreases, so the j within the bound are a prefix
    bound = torch.full_like(p_x, delta) if lam is None else (lam - 1) * p_x
    within = (cum <= bound[:, None]) & there
    c_j = (cum * within).amax(1)  # c_J, the largest c_j of the prefix; 0 where it is empty
    return p_x + c_j, within[:, 0]


def grammar_fallback(target: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """Where a relaxed residual has no mass left: uniform over the ids the grammar allows at the node, read
    off the node's own target [B, V] (the grammar gives a position either the free ids or one forced id, and
    a forced id is never free): the free ids, or the forced id where the target has mass outside them. The
    released code falls back to uniform over the whole vocabulary, which can name an id the layout forbids."""
    forced_here = (target * ~free).sum(1, keepdim=True) > 0
    allowed = torch.where(forced_here, target > 0, free[None, :]).float()
    return allowed / allowed.sum(1, keepdim=True)


def lantern_rejection_residual(
    target: torch.Tensor,
    q: torch.Tensor,
    cut: torch.Tensor,
    zero_in: str,
    fallback: torch.Tensor,
) -> torch.Tensor:
    """The target left [B, V] after a draft drawn from q [B, V] was rejected: norm(max(0, target - q)), where the
    ids `cut` [B, V] (the draft's k + 1 nearest codes, in rows where J exists) are first set to 0 in the target
    (`zero_in="p"`: EAGLE-2's rule, and Lumina's EAGLE-1 rule) or in q (`"q"`: the EAGLE-1 rule for LlamaGen and
    Anole). With a one-hot q this removes the draft itself. `fallback` [B, V] where nothing is left."""
    if zero_in not in ("p", "q"):
        raise ValueError(f"zero_in must be 'p' or 'q', got {zero_in!r}")
    if zero_in == "p":
        target = target.masked_fill(cut, 0.0)
    else:
        q = q.masked_fill(cut, 0.0)
    left = (target - q).clamp_min(0)
    mass = left.sum(1, keepdim=True)
    return torch.where(mass > RESIDUAL_EPS, left / mass.clamp_min(RESIDUAL_EPS), fallback)


def lantern_tree_rule(
    target: torch.Tensor,
    candidates: torch.Tensor,
    candidate_q: torch.Tensor,
    present: torch.Tensor,
    uniforms: torch.Tensor,
    *,
    neighbours: CodeNeighbours,
    k: int,
    delta: float | None = None,
    lam: float | None = None,
    zero_in: str = "p",
) -> tuple[torch.Tensor, torch.Tensor]:
    """LANTERN's node test: `sjd.core.verify.recursive_rejection` (same arguments and returns) with the
    relaxed mass of `lantern_credit` in place of target(c) (computed from the target left by the earlier
    siblings' rejections, as the released code does): candidate i is accepted iff u_i * q_i(c_i) < p~(c_i).
    On a rejection the target becomes `lantern_rejection_residual`, with c's first k + 1 neighbours zeroed
    when J exists; `grammar_fallback` where nothing is left. k = 0, or a bound that credits nothing
    (delta = 0 or lam = 1 with no zero-mass neighbour), gives recursive rejection sampling's outcomes."""
    B, K = candidates.shape
    fallback = grammar_fallback(target, neighbours.free)
    picked = torch.full((B,), -1, dtype=torch.long, device=target.device)
    # What does not depend on the earlier candidates' outcomes, for all K at once: the ids whose target mass each
    # test reads (the candidate, then the k neighbours it may be credited with), the k + 1 nearest codes a
    # rejection with J cuts, and u_i * q_i(c_i). The loop then only carries the target from one to the next.
    nb, there = neighbours.of(candidates.flatten(), k + 1)
    nb, there = nb.view(B, K, -1), there.view(B, K, -1)
    read = torch.cat([candidates[..., None], nb[..., :k]], 2)  # [B, K, 1 + k]
    cut = torch.zeros(*candidate_q.shape, dtype=torch.bool, device=target.device).scatter_(2, nb, there)
    scaled_u = uniforms * candidate_q.gather(2, candidates[..., None])[..., 0]
    each = zip(present.unbind(1), read.unbind(1), there[..., :k].unbind(1), cut.unbind(1), candidate_q.unbind(1),
               scaled_u.unbind(1))  # fmt: skip
    for i, (present_i, read_i, there_i, cut_i, q_i, u_q) in enumerate(each):
        open_ = present_i & (picked < 0)
        mass = target.gather(1, read_i)
        relaxed, has_j = lantern_credit(mass[:, 0], mass[:, 1:], there_i, delta, lam)
        ok = open_ & (u_q < relaxed)
        picked = torch.where(ok, i, picked)
        left = lantern_rejection_residual(target, q_i, cut_i & has_j[:, None], zero_in, fallback)
        target = torch.where((open_ & ~ok)[:, None], left, target)
    return picked, target
