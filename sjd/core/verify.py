"""Speculative verification of a window of drafts, vectorised over batch and window.

For draft j of row b (drawn from its draft distribution q[b, j]) and the target p[b, j]:
    accept  iff  u[b, j] * q[b, j, d] < p[b, j, d]     (i.e. u < min(1, p/q), no division)
The committed prefix is the drafts before the first rejection. The next token is drawn from
    norm(max(0, p - q))   at the first rejection, or
    p                     at the bonus slot when every valid draft was accepted,
which is one rule: at index n_accepted, subtract q if that index holds a draft, else nothing.

Rows verify different numbers of drafts (`n_drafts[b]`); p has one more slot than drafts
(the bonus). Everything stays on the device; the caller syncs once to read `n_accepted`.
`accepted` keeps the per-draft test outcome for all positions, so decoders that continue
verifying after the first rejection (SJD-PAC) or couple drafts (SCD) can build on it.

Every rule here (token, block, exact match) and the relaxed and tree rules elsewhere end the same
way, and that tail is written once: `accepted_prefix` turns per-draft outcomes into the accepted
length, and `stop_slot` reads the target and the rejected draft's distribution at the slot where
the window stops (the first rejection, or the bonus slot), from which the next token is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sjd.core.sampling import sample_from

# A residual whose mass is below this is rounding noise (p == q up to float error); the
# draft was then accepted with probability ~1 and we fall back to sampling p itself.
RESIDUAL_EPS = 1e-12


@dataclass
class VerifyResult:
    n_accepted: torch.Tensor  # [B] drafts accepted before the first rejection
    next_token: torch.Tensor  # [B] residual sample at the rejection, or the bonus sample
    accepted: torch.Tensor  # [B, D] outcome of each draft's own test (ignoring earlier ones)


def accept_tests(p: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """[B, D] bool: u * q(d) < p(d) for each draft, with p [B, >=D, V], q [B, D, V]."""
    d = drafts.unsqueeze(-1)
    p_d = p[:, : drafts.shape[1]].gather(-1, d).squeeze(-1)
    q_d = q.gather(-1, d).squeeze(-1)
    return uniforms * q_d < p_d


def residual(p: torch.Tensor, q: torch.Tensor, fallback: torch.Tensor | None = None) -> torch.Tensor:
    """norm(max(0, p - q)) along the last axis; `fallback` (default p) where it has no mass."""
    r = (p - q).clamp_min(0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > RESIDUAL_EPS, r / mass.clamp_min(RESIDUAL_EPS), p if fallback is None else fallback)


def accepted_prefix(passed: torch.Tensor, n_drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-draft outcomes [B, D] limited to each row's `n_drafts` real drafts, and the accepted
    length [B]: the drafts before the first failed (or absent) one."""
    D = passed.shape[1]
    accepted = passed & (torch.arange(D, device=passed.device)[None, :] < n_drafts[:, None])
    return accepted, accepted.long().cumprod(1).sum(1)


def stop_slot(
    p: torch.Tensor, q: torch.Tensor, n_accepted: torch.Tensor, n_drafts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the window stops (slot n_accepted of each row): the target there [B, V], the rejected
    draft's distribution there [B, V] (zeros at the bonus slot, where every real draft passed), and
    whether the slot holds a rejected draft [B]. p [B, D+1, V], q [B, D, V]."""
    B, D = q.shape[:2]
    rows = torch.arange(B, device=p.device)
    p_at = p[rows, n_accepted]
    if not D:
        return p_at, torch.zeros_like(p_at), torch.zeros(B, dtype=torch.bool, device=p.device)
    has_draft = n_accepted < n_drafts
    return p_at, q[rows, n_accepted.clamp(max=D - 1)] * has_draft[:, None], has_draft


def verify(
    p: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor,
    n_drafts: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> VerifyResult:
    """Speculative sampling over a window.

    p [B, D+1, V] targets (slot D is the bonus), drafts [B, D], q [B, D, V] their draft
    distributions, n_drafts [B] how many leading drafts of each row are real,
    accept_uniforms [B, D] and sample_uniforms [B] from each row's generator.
    """
    accepted, n_accepted = accepted_prefix(accept_tests(p, drafts, q, accept_uniforms), n_drafts)
    # At a rejection subtract the draft's q; at the bonus slot (n_accepted == n_drafts) nothing.
    p_at, q_at, _ = stop_slot(p, q, n_accepted, n_drafts)
    next_token = sample_from(residual(p_at, q_at), sample_uniforms)
    return VerifyResult(n_accepted, next_token, accepted)


def exact_match_verify(samples: torch.Tensor, drafts: torch.Tensor, n_drafts: torch.Tensor) -> VerifyResult:
    """Jacobi's rule: a draft is accepted iff it equals the model's own sample at its slot.

    samples [B, D+1] are one draw from p at every slot (argmax under greedy). Each committed
    token is the model's sample given an accepted prefix, so this is exact too, but a sampled
    draft rarely matches a fresh sample: it is the baseline that SJD improves on."""
    accepted, n_accepted = accepted_prefix(drafts == samples[:, : drafts.shape[1]], n_drafts)
    next_token = samples.gather(1, n_accepted[:, None]).squeeze(1)
    return VerifyResult(n_accepted, next_token, accepted)


def block_verify(
    p: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor,
    n_drafts: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> VerifyResult:
    """Block verification (Sun et al., ICLR 2025): the same inputs and outputs as `verify`, but
    the accepted length is decided for the block jointly, which accepts at least as many drafts in
    expectation (it is optimal for a single draft chain) and is exact whatever q[b, j] is, as long
    as draft j was drawn from q[b, j] given the drafts before it.

    The weight w_i = min(1, w_{i-1} p(d_i) / q(d_i)) (w_0 = 1) carries the target's spare mass
    along the block instead of spending it test by test; then
        h_i = S_i / (S_i + 1 - w_i),  S_i = sum_x max(0, w_i p_{i+1}(x) - q_{i+1}(x))   (i < n)
        h_n = w_n
    and the accepted length is the largest i with u_i < h_i (0 if none). The next token is drawn
    from norm(max(0, w_i p_{i+1} - q_{i+1})) after i < n accepted drafts, or from the bonus p.

    Unlike token verification, the accepted length depends on every draft of the block, so the
    drafts after it carry what verification saw: the next drafts must be drawn afresh (SJD's
    Jacobi update), never coupled to the old ones. `accepted` is the committed prefix.
    """
    B, D = drafts.shape
    device = p.device
    slot = torch.arange(D, device=device)[None, :]
    valid = slot < n_drafts[:, None]
    d = drafts.unsqueeze(-1)
    p_d = p[:, :D].gather(-1, d).squeeze(-1)
    q_d = q.gather(-1, d).squeeze(-1)
    log_ratio = torch.where(valid, p_d.clamp_min(1e-30).log() - q_d.clamp_min(1e-30).log(), 0.0)
    # log w_i = min(0, log w_{i-1} + log ratio_i) = c_i - max_{k <= i} c_k with c the cumulative sum.
    c = torch.cat([torch.zeros(B, 1, device=device), log_ratio.cumsum(1)], 1)
    w = (c - c.cummax(1).values).exp()  # [B, D+1]: w_0 .. w_D
    spare = (w[:, :D, None] * p[:, :D] - q).clamp_min(0).sum(-1)  # S_0 .. S_{D-1}
    denom = spare + 1 - w[:, :D]
    h = torch.where(denom > RESIDUAL_EPS, spare / denom.clamp_min(RESIDUAL_EPS), 1.0)  # h_0 .. h_{D-1}
    # h_i for i = 1 .. D: S-based before the row's last draft, w at it, 0 past it (never accepted).
    length = slot + 1
    h_later = torch.cat([h[:, 1:], torch.zeros(B, 1, device=device)], 1)
    h_at = torch.where(length < n_drafts[:, None], h_later, torch.where(length == n_drafts[:, None], w[:, 1:], 0.0))
    passes = accept_uniforms < h_at
    last_pass = D - passes.flip(1).long().argmax(1) if D else torch.zeros(B, dtype=torch.long, device=device)
    n_accepted = torch.where(passes.any(1), last_pass, 0)
    p_at, q_at, has_draft = stop_slot(p, q, n_accepted, n_drafts)
    rows = torch.arange(B, device=device)
    weighted = torch.where(has_draft[:, None], w[rows, n_accepted].unsqueeze(1) * p_at, p_at)
    next_token = sample_from(residual(weighted, q_at, fallback=p_at), sample_uniforms)
    return VerifyResult(n_accepted, next_token, slot < n_accepted[:, None])


def recursive_rejection(
    target: torch.Tensor,
    candidates: torch.Tensor,
    candidate_q: torch.Tensor,
    present: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling over several candidates for one position (the tree rules' kernel).

    `target` [B, V] the distribution to sample, `candidates` [B, K] in test order, `candidate_q` [B, K, V]
    the distribution each was drawn from given the ones before it, `present` [B, K], `uniforms` [B, K].
    Candidate i is accepted iff u_i * q_i(c_i) < target(c_i); on rejection target <- norm(max(0, target -
    q_i)) (`residual`). Each stage is a speculative-sampling step whose fallback is the next stage, so a
    sample of the target left after the last rejection is distributed as the original target.
    - Deterministic candidates (EAGLE-2's top-k children) are tested with a one-hot q_i: accept iff
      u < target(c), on rejection remove c and renormalise, which is exact for any candidate set chosen
      without the verification coins (docs/algorithms.md §12.4).
    - Candidates drawn from q without replacement (EAGLE-1's children, SJD-PAC's siblings) are tested with
      q_i = q without the earlier candidates, renormalised (`without_replacement_q`).
    - Candidates each drawn on its own, independently of the others and of every coin (Hawk's cached vertical
      speculations), are tested with the q each was drawn from, whatever those q are.
    Returns the accepted candidate's index (-1: none) and the target left."""
    B, K = candidates.shape
    rows = torch.arange(B, device=target.device)
    picked = torch.full((B,), -1, dtype=torch.long, device=target.device)
    for i in range(K):
        open_ = present[:, i] & (picked < 0)
        c, q_i = candidates[:, i], candidate_q[:, i]
        ok = open_ & (uniforms[:, i] * q_i[rows, c] < target[rows, c])
        picked = torch.where(ok, i, picked)
        target = torch.where((open_ & ~ok)[:, None], residual(target, q_i), target)
    return picked, target


def without_replacement_q(q: torch.Tensor, drawn: torch.Tensor, removed: torch.Tensor | None = None) -> torch.Tensor:
    """[B, K, V]: the distribution draw i of an ordered draw without replacement came from: q [B, V]
    without `removed` [B] (if given) and draws 0 .. i-1 of `drawn` [B, K], renormalised. All K at once: draw i's
    pool is q with the ids drawn before it set to 0."""
    pool = q if removed is None else q.scatter(1, removed[:, None], 0.0)
    hits = torch.zeros(*drawn.shape, q.shape[-1], dtype=torch.int32, device=q.device).scatter_(2, drawn[..., None], 1)
    before = (hits.cumsum(1, dtype=torch.int32) - hits) > 0  # [B, K, V]: drawn at an earlier i
    pool = pool[:, None].masked_fill(before, 0.0)
    return pool / pool.sum(-1, keepdim=True).clamp_min(1e-30)
