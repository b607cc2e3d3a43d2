"""DELIBERATELY FAULTY decoders: the negative controls the exactness audits must catch.

Each is a lossless decoder with one known slip, made by overriding one phase (SJD's, coupled SJD's or
EAGLE's). They exist only for tests and for the controls study (`python run.py experiment=audit_controls`, its page
docs/results/audit_controls.md); no config in conf/decoder/ names them. Each keeps `lossless = True`,
the claim it would make, so an audit that catches it has caught a false claim.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass

import torch

from sjd.core.sampling import filter_top_k_top_p, sample_from
from sjd.core.verify import VerifyResult, block_verify, recursive_rejection
from sjd.core.verify import verify as speculative_verify
from sjd.decoders.base import Decoder
from sjd.decoders.coupled import CoupledSJDDecoder, maximal_coupling_drafts
from sjd.decoders.eagle import EagleDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.window import WindowStep
from sjd.drafters.tree import child_q


@dataclass(eq=False, kw_only=True)
class ResampleFromP(SJDDecoder):
    """FAULTY: a rejected draft's replacement is drawn from p instead of norm(max(0, p - q))."""

    name: str = "resample_from_p"
    window: int = 4

    def accept(self, step: WindowStep, accept_uniforms, sample_uniforms) -> VerifyResult:
        p, drafts, q, n_drafts = step.p, step.drafts, step.q, step.n_drafts
        rule = block_verify if self.verification == "block" else speculative_verify
        result = rule(p, drafts, q, n_drafts, accept_uniforms, sample_uniforms)
        rows = torch.arange(p.shape[0], device=p.device)
        from_p = sample_from(p[rows, result.n_accepted], sample_uniforms)
        rejected = result.n_accepted < n_drafts
        return VerifyResult(result.n_accepted, torch.where(rejected, from_p, result.next_token), result.accepted)


@dataclass(eq=False, kw_only=True)
class StaleQMaximal(CoupledSJDDecoder):
    """FAULTY (SCD-MC as released): maximal coupling that keeps a kept draft's old q instead of p."""

    name: str = "stale_q_maximal"
    window: int = 4
    coupling: str = "maximal"

    def next_drafts(self, step: WindowStep, uniforms) -> tuple:
        p, drafts, q, n_drafts, result = step.p, step.drafts, step.q, step.n_drafts, step.result
        samples = sample_from(p, uniforms)
        if not drafts.shape[1]:
            return samples, p
        samples = maximal_coupling_drafts(p, drafts, q, n_drafts, result.accepted, uniforms, samples)
        D = drafts.shape[1]
        kept = (result.accepted & (torch.arange(D, device=p.device)[None] < n_drafts[:, None]))[..., None]
        recorded = p.clone()
        recorded[:, :D] = torch.where(kept, q, p[:, :D])
        return samples, recorded


@dataclass(eq=False, kw_only=True)
class SlotGumbel(CoupledSJDDecoder):
    """FAULTY (SCD-GS as released): one Gumbel vector per window slot, not per absolute position, so as
    the window slides one token a step the same vector draws consecutive positions."""

    name: str = "slot_gumbel"
    window: int = 4
    coupling: str = "gumbel"

    def next_drafts(self, step: WindowStep, uniforms) -> tuple:
        p, state = step.p, step.state
        slots = torch.arange(p.shape[1], device=p.device).expand(p.shape[0], -1)
        g = state.noise[torch.arange(p.shape[0], device=p.device)[:, None], slots]
        return (p.log() + g).argmax(-1), p


@dataclass(eq=False, kw_only=True)
class QBeforeTopK(SJDDecoder):
    """FAULTY: drafts drawn from the top-k of p, but recorded with q = p (the distribution before top-k)."""

    name: str = "q_before_top_k"
    window: int = 4
    top_k: int = 2

    def next_drafts(self, step: WindowStep, uniforms) -> tuple:
        p = step.p
        drawn_from = filter_top_k_top_p(p.log(), self.top_k, None).softmax(-1)
        return sample_from(drawn_from, uniforms), p


@dataclass(eq=False, kw_only=True)
class LowPrecisionDrafts(SJDDecoder):
    """FAULTY: drafts drawn from p rounded to a low-precision dtype (renormalised), recorded with the
    full-precision p that verification uses."""

    name: str = "low_precision_drafts"
    window: int = 4
    draft_dtype: str = "float8_e4m3fn"  # a name, so the decoder's config() stays JSON

    def next_drafts(self, step: WindowStep, uniforms) -> tuple:
        p = step.p
        low = p.to(getattr(torch, self.draft_dtype)).float()
        return sample_from(low / low.sum(-1, keepdim=True), uniforms), p


@dataclass(eq=False, kw_only=True)
class RatioRuleOnTopK(EagleDecoder):
    """FAULTY: EAGLE-2's deterministic top-k children verified with EAGLE-1's ratio rule (accept the i-th child
    x iff u * q_i(x) < p(x), q_i = q without the earlier children), which is exact only for children drawn from
    q. With p = (.5, .5) and the arg-max child of q = (.6, .4), the child is committed with probability 5/6.
    `window`, as every control takes it, is the tree's forward width (EAGLE's `total_tokens`)."""

    name: str = "ratio_rule_top_k"
    window: InitVar[int | None] = None

    def __post_init__(self, window: int | None) -> None:
        self.drafter = self.drafter or {"weights": "random"}
        self.total_tokens = window if window is not None else self.total_tokens
        super().__post_init__()

    def candidate_q(self, tree):
        return child_q(tree, drawn=True)  # as if the top-k children had been drawn from q

    def node_rule(self, adapter):
        return recursive_rejection

    def keeps_node_q(self) -> bool:
        return True


CONTROLS = {
    "resample_from_p": ResampleFromP,
    "stale_q_maximal": StaleQMaximal,
    "slot_gumbel": SlotGumbel,
    "q_before_top_k": QBeforeTopK,
    "low_precision_drafts": LowPrecisionDrafts,
    "ratio_rule_top_k": RatioRuleOnTopK,
}


def make_control(name: str, window: int = 4) -> Decoder:
    """The deliberately faulty decoder `name` (a key of CONTROLS) at `window`."""
    if name not in CONTROLS:
        raise ValueError(f"unknown negative control {name!r}; one of {sorted(CONTROLS)}")
    return CONTROLS[name](name=name, window=window)
