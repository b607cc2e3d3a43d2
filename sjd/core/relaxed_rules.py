"""Relaxed (lossy) acceptance rules for speculative Jacobi windows: GSD and LANTERN-style.

Both accept a draft x more often than min(1, p(x)/q(x)) by crediting x with the target mass
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
  x and its credited neighbours removed, as LANTERN does.

Pure functions, vectorised over batch and window, as sjd.core.verify.
"""

from __future__ import annotations

import torch

from sjd.core.sampling import sample_from
from sjd.core.verify import VerifyResult, accepted_prefix, residual, stop_slot


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
