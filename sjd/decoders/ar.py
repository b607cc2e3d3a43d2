"""Plain autoregressive decoding: the reference distribution every other decoder must match.

One forward per token (the prefill predicts the first), with CFG rows batched in the same
forward and the shared logits pipeline, exactly as the speculative decoders use them. It also
reports each sample's mean entropy (nats) of the sampling distribution over its code positions,
at the run's sampling settings: the regime a decoder runs in (docs/design.md, "Regimes").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sjd.core.sampling import SamplingConfig, row_uniforms
from sjd.decoders.base import Decoder, DecodeResult, ForwardClock
from sjd.models.base import ModelAdapter
from sjd.types import Prompt


@dataclass(eq=False, kw_only=True)
class ARDecoder(Decoder):
    name: str = "ar"

    def generate(
        self,
        adapter: ModelAdapter,
        prompts: Sequence[Prompt],
        sampling: SamplingConfig,
        generators: Sequence[torch.Generator],
    ) -> DecodeResult:
        layout, device, B = adapter.layout, adapter.device, len(prompts)
        clock = ForwardClock(adapter)
        tokens = torch.empty(B, layout.n_tokens, dtype=torch.long, device=device)
        entropy = torch.zeros(B, dtype=torch.float64, device=device)  # summed over code positions
        free = (layout.forced < 0).tolist()
        tokens[:, 0] = clock.start(prompts, sampling, generators)  # prefill and position 0, as every decoder's
        # Each row's uniforms for all its steps in one draw: nothing else draws from a row's generator while AR steps,
        # and on the CPU one draw of n is the same stream as n draws of one (tests/decoders/test_ar_baseline.py), so
        # a step calls no generator (what a graphed step needs). [N - 1, B]: a step reads a contiguous row.
        uniforms = row_uniforms(generators, device, (layout.n_tokens - 1,)).T.contiguous()
        clock.defer_finite_check = True  # AR reads nothing a step: every forward's NaN/inf flag is read at the end
        measure_s = self.measure(entropy, clock.first_p, free[0], clock)
        for pos in range(1, layout.n_tokens):
            logits = clock.forward(tokens[:, pos - 1 : pos], [pos - 1] * B)
            positions = torch.full((B, 1), pos, device=device)
            probs = self.kernels.pipeline(logits, positions, layout, sampling)  # [B, 1, V]
            clock.lap("pipeline")
            measure_s += self.measure(entropy, probs[:, 0], free[pos], clock)
            tokens[:, pos] = self.kernels.sample_from(probs[:, 0], uniforms[pos - 1])
            clock.lap("verify")
        result = clock.finish(tokens, [clock.calls] * B, [[1] * layout.n_tokens for _ in range(B)], measure_s)
        result.extras["window_inputs"] = [clock.calls - 1] * B  # one input a forward
        result.entropy_nats = self.mean_entropy(entropy, sum(free))
        return result

    @staticmethod
    def mean_entropy(entropy: torch.Tensor, codes: int) -> list[float]:
        """Each row's summed entropy over its `codes` code positions, as a mean on the host: read once the decode
        has finished and the device is idle."""
        return (entropy / max(1, codes)).tolist()

    @staticmethod
    def measure(entropy: torch.Tensor, probs: torch.Tensor, free: bool, clock: ForwardClock) -> float:
        """Add the entropy of `probs` [B, V] to `entropy` at a code position: a measurement, not decoding, so its
        seconds are returned to be kept out of the decode time and out of its split by stage."""
        if not free:
            return 0.0
        t_measure = time.perf_counter()
        entropy += torch.special.entr(probs).sum(-1)
        clock.stages.exclude()
        return time.perf_counter() - t_measure
