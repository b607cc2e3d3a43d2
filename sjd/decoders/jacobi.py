"""Jacobi decoding (docs/algorithms.md §3): the fixed-point iteration over a window of drafts.

The window, drafting and commit are SJD's (sjd.decoders.sjd); only verification differs. A
draft is accepted iff it equals the model's own sample at its slot (the arg-max under greedy,
where the result equals greedy AR token for token). With sampling this is the exact-match
rule of the SJD paper's Jacobi baseline row: exact in distribution, and almost never faster,
because a sampled draft rarely matches a fresh sample. The samples at the slots after the
commit become the next drafts, as in SJD.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sjd.core.sampling import sample_from
from sjd.core.verify import exact_match_verify
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.window import WindowStep
from sjd.decoders.window_state import draw_uniforms


@dataclass(eq=False, kw_only=True)
class JacobiDecoder(SJDDecoder):
    verifications = ("exact_match",)

    name: str = "jacobi"
    verification: str = field(default="exact_match", init=False)  # recorded with the results: not SJD's rule

    def verify(self, step: WindowStep) -> None:
        """A draft is accepted iff it equals the model's own sample at its slot; the samples carry on."""
        _, u_sample = draw_uniforms(step.call.generators, step.widths, step.p.shape[1], step.p.device)
        samples = sample_from(step.p, u_sample)
        step.result, step.samples, step.samples_q = (
            exact_match_verify(samples, step.drafts, step.n_drafts),
            samples,
            step.p,
        )
