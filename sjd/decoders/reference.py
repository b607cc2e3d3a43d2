"""Speculative Jacobi Decoding on one screen: the algorithm of `SJDDecoder`, for one image, in one function.

Read this to learn SJD; read sjd/decoders/sjd.py to see it batched, timed and extended (coupled drafts,
branches, trained drafters, other schedules and rules). `tests/decoders/test_reference_sjd.py` holds `SJDDecoder`
(random drafts, the token rule) to this function token for token at fixed seeds, under both schedules.
It calls only the adapter contract and the pure pieces every decoder shares: the logits pipeline
(`logits_to_probs`), inverse-CDF sampling (`sample_from`), fresh random drafts and the window rule.
"""

from __future__ import annotations

import torch

from sjd.core.drafts import fresh_drafts, one_hot
from sjd.core.sampling import SamplingConfig, logits_to_probs, sample_from, sample_rows
from sjd.core.schedule import OFFICIAL_L, make_schedule
from sjd.core.verify import RESIDUAL_EPS
from sjd.models.base import ModelAdapter
from sjd.types import Prompt


@torch.no_grad()
def speculative_jacobi_decode(
    adapter: ModelAdapter,
    prompt: Prompt,
    sampling: SamplingConfig,
    generator: torch.Generator,
    window: int = 16,
    schedule: str = "harness",
    forced_drafts: bool = True,
    official_l: int = OFFICIAL_L,
) -> tuple[torch.Tensor, list[int]]:
    """One image's tokens [N] and the tokens each forward committed (the prefill's first)."""
    layout, device = adapter.layout, adapter.device
    rule = make_schedule(schedule, window, 1, 0, layout, adapter.official_schedule, official_l)
    tokens = torch.zeros(layout.n_tokens, dtype=torch.long, device=device)
    # Prefill, and generated position 0 drawn as AR draws it.
    logits = adapter.prefill([prompt], sampling.uses_uncond)
    first_p = logits_to_probs(logits, torch.zeros(1, 1, dtype=torch.long, device=device), layout, sampling)
    tokens[0] = sample_rows(first_p[:, 0], [generator])[0]
    n, previous, committed = 1, 0, [1]  # committed tokens; n before the last commit; tokens per forward
    carried = torch.empty(0, dtype=torch.long, device=device)  # drafts for positions n, n + 1, ...
    carried_q = torch.empty(0, layout.vocab_size, device=device)  # ... and the distributions they came from
    while (width := rule.width(n, previous)) > 0:
        # 1. Drafts for the window's width - 1 positions after the last committed token: those the last
        #    iteration carried (its own samples, q = its p), topped up with fresh random ones (one-hot q).
        need = width - 1
        drafts, q = carried[:need], carried_q[:need]
        if len(drafts) < need:
            fresh = fresh_drafts("random", drafts, n + len(drafts), need - len(drafts), layout, generator,
                                 force=forced_drafts)  # fmt: skip
            drafts, q = torch.cat([drafts, fresh]), torch.cat([q, one_hot(fresh, layout.vocab_size)])
        # 2. One forward of [last committed token, drafts]: output i predicts position n + i.
        logits = adapter.forward(torch.cat([tokens[n - 1 : n], drafts])[None], [n - 1])
        positions = n + torch.arange(width, device=device)
        p = logits_to_probs(logits, positions[None], layout, sampling)[0]  # [width, V], the shared pipeline
        u_accept, u_jacobi = torch.rand(2, width, generator=generator, device=device)
        # 3. Accept drafts left to right while u < p(d) / q(d): speculative sampling, exact.
        k = 0
        while k < need and u_accept[k] * q[k, drafts[k]] < p[k, drafts[k]]:
            k += 1
        # 4. The next token: from the residual norm(max(0, p - q)) at the first rejection, or p past the last draft.
        rest = (p[k] - (q[k] if k < need else torch.zeros_like(p[k]))).clamp_min(0)
        mass = rest.sum()
        next_token = sample_from(rest / mass if mass > RESIDUAL_EPS else p[k], u_accept[need])
        tokens[n : n + k], tokens[n + k] = drafts[:k], next_token
        # 5. The Jacobi update: the model's own samples past the commit are the next drafts, q = p.
        samples = sample_from(p, u_jacobi)
        carried, carried_q = samples[k + 1 : width], p[k + 1 : width]
        previous, n = n, n + k + 1
        committed.append(k + 1)
    return tokens.cpu(), committed
