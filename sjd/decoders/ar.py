"""Plain autoregressive decoding: the reference distribution every other decoder must match.

One forward per token (the prefill predicts the first), with CFG rows batched in the same
forward and the shared logits pipeline, exactly as the speculative decoders use them. It also
reports each sample's mean entropy (nats) of the sampling distribution over its code positions,
at the run's sampling settings: the regime a decoder runs in (docs/design.md, "Regimes").
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from sjd.core.sampling import SamplingConfig, row_uniforms
from sjd.decoders.base import Decoder, DecodeResult, ForwardClock, device_sync
from sjd.models.base import ModelAdapter
from sjd.types import Prompt


class ARDecoder(Decoder):
    def __init__(self, name: str = "ar") -> None:
        self.name = name

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

        t0 = time.perf_counter()
        logits = clock.prefill(prompts, sampling.uses_uncond)
        t_prefill = time.perf_counter() - t0
        entropy = torch.zeros(B, dtype=torch.float64, device=device)  # summed over code positions
        measure_s = 0.0
        free = (layout.forced < 0).tolist()
        clock.defer_finite_check = True  # AR reads nothing a step: every forward's NaN/inf flag is read at the end
        clock.stages.begin()
        for pos in range(layout.n_tokens):
            positions = torch.full((B, 1), pos, device=device)
            probs = self.kernels.pipeline(logits, positions, layout, sampling)  # [B, 1, V]
            clock.lap("pipeline")
            if free[pos]:  # a measurement, not decoding: kept out of the decode time and its split
                t_measure = time.perf_counter()
                entropy += torch.special.entr(probs[:, 0]).sum(-1)
                clock.stages.exclude()
                measure_s += time.perf_counter() - t_measure
            tokens[:, pos] = self.kernels.sample_from(probs[:, 0], row_uniforms(generators, device))
            clock.lap("verify")
            if pos + 1 < layout.n_tokens:  # the last token needs no forward of its own
                logits = clock.forward(tokens[:, pos : pos + 1], [pos] * B)
        clock.read(torch.zeros(0, dtype=torch.long, device=device))  # raises, naming the forward, on a NaN/inf
        device_sync(device)
        decode_s = time.perf_counter() - t0 - t_prefill - measure_s

        return DecodeResult(
            tokens=tokens.cpu(),
            n_forward=[clock.calls] * B,
            accepted=[[1] * layout.n_tokens for _ in range(B)],
            prefill_s=t_prefill,
            decode_s=decode_s,
            model_s=clock.model_s,
            stage_s=clock.stages.split(decode_s),
            extras={"stage_laps": clock.stages.n_laps, "window_inputs": [clock.calls - 1] * B},  # one input a forward
            entropy_nats=(entropy / max(1, sum(free))).tolist(),
        )
