"""Jacobi decoding (docs/algorithms.md §3): the fixed-point iteration over a window of drafts.

The window, drafting and commit are SJD's (sjd.decoders.sjd); only verification differs. A
draft is accepted iff it equals the model's own sample at its slot (the arg-max under greedy,
where the result equals greedy AR token for token). With sampling this is the exact-match
rule of the SJD paper's Jacobi baseline row: exact in distribution, and almost never faster,
because a sampled draft rarely matches a fresh sample. The samples at the slots after the
commit become the next drafts, as in SJD.
"""

from __future__ import annotations

import torch

from sjd.core.sampling import sample_from
from sjd.core.schedule import OFFICIAL_L
from sjd.core.verify import VerifyResult, exact_match_verify
from sjd.decoders.sjd import SJDDecoder, WindowCall, WindowState, draw_uniforms


class JacobiDecoder(SJDDecoder):
    def __init__(
        self,
        name: str = "jacobi",
        window: int = 16,
        init: str = "random",
        ar_prefix: int = 1,
        ar_suffix: int = 0,
        forced_drafts: bool = True,
        schedule: str = "harness",
        official_l: int = OFFICIAL_L,
    ) -> None:
        super().__init__(
            name=name,
            window=window,
            init=init,
            ar_prefix=ar_prefix,
            ar_suffix=ar_suffix,
            forced_drafts=forced_drafts,
            schedule=schedule,
            official_l=official_l,
        )
        self.verification = "exact_match"  # recorded with the results: Jacobi's rule, not SJD's

    def verify(
        self,
        p: torch.Tensor,
        drafts: torch.Tensor,
        q: torch.Tensor,
        widths: list[int],
        positions: torch.Tensor,
        state: WindowState,
        call: WindowCall,
    ) -> tuple[VerifyResult, torch.Tensor, torch.Tensor]:
        n_drafts = torch.tensor([max(w - 1, 0) for w in widths], device=p.device)
        _, u_sample = draw_uniforms(call.generators, widths, p.shape[1], p.device)
        samples = sample_from(p, u_sample)
        return exact_match_verify(samples, drafts, n_drafts), samples, p
