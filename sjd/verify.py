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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sjd.sampling import sample_from

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


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) along the last axis; p where the residual has no mass."""
    r = (p - q).clamp_min(0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > RESIDUAL_EPS, r / mass.clamp_min(RESIDUAL_EPS), p)


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
    B, D = drafts.shape
    valid = torch.arange(D, device=p.device)[None, :] < n_drafts[:, None]
    accepted = accept_tests(p, drafts, q, accept_uniforms) & valid
    n_accepted = accepted.long().cumprod(1).sum(1)
    rows = torch.arange(B, device=p.device)
    p_at = p[rows, n_accepted]  # [B, V]
    # At a rejection subtract the draft's q; at the bonus slot (n_accepted == n_drafts) nothing.
    if D:
        has_draft = (n_accepted < n_drafts).unsqueeze(1)
        q_at = q[rows, n_accepted.clamp(max=D - 1)] * has_draft
    else:
        q_at = torch.zeros_like(p_at)
    next_token = sample_from(residual(p_at, q_at), sample_uniforms)
    return VerifyResult(n_accepted, next_token, accepted)


def exact_match_verify(samples: torch.Tensor, drafts: torch.Tensor, n_drafts: torch.Tensor) -> VerifyResult:
    """Jacobi's rule: a draft is accepted iff it equals the model's own sample at its slot.

    samples [B, D+1] are one draw from p at every slot (argmax under greedy). Each committed
    token is the model's sample given an accepted prefix, so this is exact too, but a sampled
    draft rarely matches a fresh sample: it is the baseline that SJD improves on."""
    B, D = drafts.shape
    valid = torch.arange(D, device=drafts.device)[None, :] < n_drafts[:, None]
    accepted = (drafts == samples[:, :D]) & valid
    n_accepted = accepted.long().cumprod(1).sum(1)
    next_token = samples.gather(1, n_accepted[:, None]).squeeze(1)
    return VerifyResult(n_accepted, next_token, accepted)
