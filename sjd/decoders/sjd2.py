"""Speculative Jacobi-Denoising Decoding (SJD2, NeurIPS 2025; docs/algorithms.md §10).

SJD's loop on a noise-aware fine-tuned model (the `embeds` capability): window slots that have
no draft yet enter as pure Gaussian noise in embedding space, and every draft carried to the
next iteration enters as its token's embedding mixed with noise at a level that falls by one
denoising step per iteration (x_t = (1 - t) e_hat + t eps, the model's own schedule), so a
draft is refined along a denoising trajectory instead of being redrawn from scratch. Drafts are
verified with SJD's speculative rule against the distribution they were drawn from; the first
slot without a draft ends the verified prefix and takes a sample from p (as a bonus token).

Not lossless: p at a slot is conditioned on *noisy* embeddings of the accepted drafts before
it, not on the clean tokens. With `denoise_steps: 1` every carried draft enters clean, p is
conditioned on clean tokens only, and the decoder is exact (SJD with a noise-initialised
window); the tests use that to check the loop against AR.

Our choices where the paper leaves room (conf/decoder/sjd2.yaml): `window` counts
forward inputs as in SJD; the level falls linearly from pure noise to clean over
`denoise_steps` iterations; fresh noise is drawn every iteration (from each row's generator);
with `forced_drafts` (the default) grammar-forced slots get the forced token, clean, with a one-hot
draft distribution. `forced_drafts: false` gives them no draft: they enter as pure noise like every
fresh slot and end the verified prefix, as a random draft there ends it in the official SJD sampler
(SJD2's code is unreleased; the paper overlays take that reading, conf/experiment/sjd2_*.yaml).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from sjd.core.sampling import SamplingConfig, logits_to_probs, sample_from
from sjd.core.schedule import OFFICIAL_L
from sjd.core.verify import verify as speculative_verify
from sjd.decoders.base import Decoder, DecodeResult, ForwardClock
from sjd.decoders.sjd import SJDDecoder, WindowState, draw_uniforms
from sjd.models.base import ModelAdapter
from sjd.types import EMBEDS, WINDOW, Prompt


class SJD2Decoder(Decoder):
    requires = frozenset({WINDOW, EMBEDS})
    lossless = False

    def __init__(
        self,
        name: str = "sjd2",
        window: int = 32,
        denoise_steps: int = 2,
        ar_prefix: int = 1,
        ar_suffix: int = 0,
        schedule: str = "harness",
        forced_drafts: bool = True,
        official_l: int = OFFICIAL_L,
    ) -> None:
        if denoise_steps < 1:
            raise ValueError(f"decoder.denoise_steps must be >= 1, got {denoise_steps}")
        # SJD's window rules (and their validation); SJD2's official code is unreleased, and its authors'
        # SJD sampler is the one it extends, so `official` is SJD's rule (sjd.core.schedule).
        self._windows = SJDDecoder(
            window=window, ar_prefix=ar_prefix, ar_suffix=ar_suffix, schedule=schedule, official_l=official_l
        )
        self.name, self.window, self.denoise_steps = name, window, denoise_steps
        self.ar_prefix, self.ar_suffix, self.schedule, self.official_l = ar_prefix, ar_suffix, schedule, official_l
        self.forced_drafts = forced_drafts
        self.lossless = denoise_steps == 1

    def check(self, adapter: ModelAdapter) -> None:
        if EMBEDS not in adapter.capabilities:
            raise ValueError(
                f"decoder {self.name!r} needs model capabilities ['embeds'] (a noise-aware fine-tuned checkpoint), "
                f"which model {adapter.name!r} does not provide (it has {sorted(adapter.capabilities)}); "
                "on the toy use model=toy_sjd2 (scripts/finetune_sjd2.py makes its checkpoint), on Lumina-mGPT / "
                "Emu3 model=lumina_sjd2 / emu3_sjd2 (scripts/finetune_sjd2_hf.py makes theirs)"
            )
        super().check(adapter)
        self._windows.check(adapter)

    def next_level(self, level: torch.Tensor, pure_noise: int) -> torch.Tensor:
        step = math.ceil(pure_noise / self.denoise_steps)
        return (level - step).clamp(min=0)

    def generate(
        self,
        adapter: ModelAdapter,
        prompts: Sequence[Prompt],
        sampling: SamplingConfig,
        generators: Sequence[torch.Generator],
    ) -> DecodeResult:
        layout, device, B = adapter.layout, adapter.device, len(prompts)
        V, D, noise_level = layout.vocab_size, adapter.embed_dim, adapter.noise_levels - 1
        clock = ForwardClock(adapter)
        state = WindowState.empty(B, layout.n_tokens, V, device)
        levels = [torch.empty(0, dtype=torch.long, device=device)] * B  # of the carried drafts
        forced = layout.forced.to(device)

        schedule = self._windows.window_schedule(adapter)
        state.tokens[:, 0] = clock.start(prompts, sampling, generators)

        while True:
            widths = SJDDecoder.widths(schedule, state)
            if max(widths) == 0:
                break
            W = max(widths)
            # -- draft: [last committed, carried drafts (noisy), forced tokens, pure noise] ------------
            tokens = torch.zeros(B, W, dtype=torch.long, device=device)
            in_levels = torch.full((B, W), noise_level, dtype=torch.long, device=device)
            drafts = torch.zeros(B, max(W - 1, 0), dtype=torch.long, device=device)
            q = torch.zeros(B, max(W - 1, 0), V, device=device)
            n_drafts = torch.zeros(B, dtype=torch.long, device=device)
            noise = torch.zeros(B, W, D, device=device)
            for b in range(B):
                n, w = state.committed[b], widths[b]
                if w == 0:
                    continue
                tokens[b, 0], in_levels[b, 0] = state.tokens[b, n - 1], 0
                k = min(len(state.carried[b]), w - 1)
                tokens[b, 1 : 1 + k], in_levels[b, 1 : 1 + k] = state.carried[b][:k], levels[b][:k]
                drafts[b, :k], q[b, :k] = state.carried[b][:k], state.carried_q[b][:k]
                slot_forced = forced[n + k : n + w - 1]  # fresh slots: forced ones are known, clean
                is_forced = (slot_forced >= 0) & self.forced_drafts  # else they enter as noise, like any fresh slot
                tokens[b, 1 + k : w] = slot_forced.clamp(min=0)
                in_levels[b, 1 + k : w] = torch.where(is_forced, 0, noise_level)
                lead = int(is_forced.long().cumprod(0).sum())  # forced slots right after the drafts verify too
                drafts[b, k : k + lead] = slot_forced[:lead]
                q[b, k : k + lead] = torch.nn.functional.one_hot(slot_forced[:lead], V).float()
                n_drafts[b] = k + lead
                noise[b, :w] = torch.randn(w, D, generator=generators[b], device=device)
            # -- forward the noisy window ----------------------------------------------------------------
            embeds = adapter.embed(tokens, in_levels, noise)
            clock.lap("draft")
            logits = clock.forward_embeds(embeds, in_levels, [n - 1 for n in state.committed])
            positions = torch.as_tensor(state.committed, device=device)[:, None] + torch.arange(W, device=device)
            p = logits_to_probs(logits, positions, layout, sampling)
            clock.lap("pipeline")
            # -- verify: speculative rule up to the first slot without a draft ---------------------------
            u_accept, u_jacobi = draw_uniforms(generators, widths, W, device)
            u_final = u_accept.gather(1, n_drafts[:, None]).squeeze(1)
            result = speculative_verify(p, drafts, q, n_drafts, u_accept[:, :-1], u_final)
            samples = sample_from(p, u_jacobi)
            clock.lap("verify")
            # -- commit, and carry the model's samples one denoising step cleaner ------------------------
            state.commit(result, drafts, samples, p, widths)
            for b in range(B):
                if widths[b] == 0:
                    continue
                take = state.accepted[b][-1]
                old = in_levels[b, take + 1 : widths[b] + 1]  # the level each carried position entered at
                old = torch.cat([old, torch.full((len(state.carried[b]) - len(old),), noise_level, device=device)])
                levels[b] = self.next_level(old, noise_level)
            clock.lap("commit")

        return clock.finish(state.tokens, state.n_forward, state.accepted)
