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
from dataclasses import dataclass, field

import torch

from sjd.core.sampling import sample_from
from sjd.decoders.window import WindowCall, WindowDecoder, WindowStep
from sjd.decoders.window_state import WindowState, draw_uniforms
from sjd.models.base import ModelAdapter
from sjd.types import EMBEDS, WINDOW, ImageLayout


@dataclass
class NoisyWindow:
    """One forward's inputs: tokens and the noise level each slot enters at, and the drafts verified."""

    tokens: torch.Tensor  # [B, W] ids (embedded clean, or mixed with noise at their level)
    levels: torch.Tensor  # [B, W] noise level per slot (0 = clean)
    noise: torch.Tensor  # [B, W, D] Gaussian noise per slot
    drafts: torch.Tensor  # [B, W-1] the drafts verified: carried ones, then forced slots right after them
    q: torch.Tensor  # [B, W-1, V] their draft distributions
    n_drafts: torch.Tensor  # [B]
    embeds: torch.Tensor | None = None  # [B, W, D] the forward's input embeddings


@dataclass
class NoisyState(WindowState):
    """SJD's row state, and the noise level each carried draft enters the next forward at."""

    levels: list[torch.Tensor] = field(default_factory=list)


@dataclass
class NoisyStep(WindowStep):
    window: NoisyWindow | None = None


@dataclass(eq=False, kw_only=True)
class SJD2Decoder(WindowDecoder):
    requires = frozenset({WINDOW, EMBEDS})
    lossless = False

    name: str = "sjd2"
    window: int = 32
    denoise_steps: int = 2

    def __post_init__(self) -> None:
        if self.denoise_steps < 1:
            raise ValueError(f"decoder.denoise_steps must be >= 1, got {self.denoise_steps}")
        # SJD's window rules; SJD2's official code is unreleased, and its authors' SJD sampler is the one
        # it extends, so `official` is SJD's rule (sjd.core.schedule).
        super().__post_init__()
        self.lossless = self.denoise_steps == 1

    def check(self, adapter: ModelAdapter) -> None:
        if EMBEDS not in adapter.capabilities:
            raise ValueError(
                f"decoder {self.name!r} needs model capabilities ['embeds'] (a noise-aware fine-tuned checkpoint), "
                f"which model {adapter.name!r} does not provide (it has {sorted(adapter.capabilities)}); "
                "on the toy use model=toy_sjd2 (scripts/finetune_sjd2.py makes its checkpoint), on Lumina-mGPT / "
                "Emu3 model=lumina_sjd2 / emu3_sjd2 (scripts/finetune_sjd2_hf.py makes theirs)"
            )
        super().check(adapter)

    def next_level(self, level: torch.Tensor, pure_noise: int) -> torch.Tensor:
        step = math.ceil(pure_noise / self.denoise_steps)
        return (level - step).clamp(min=0)

    def new_state(self, B: int, layout: ImageLayout, device: torch.device) -> NoisyState:
        empty = torch.empty(0, dtype=torch.long, device=device)
        return NoisyState(**vars(WindowState.empty(B, layout.n_tokens, layout.vocab_size, device)), levels=[empty] * B)

    def new_step(self, call: WindowCall, state: WindowState, widths: list[int]) -> NoisyStep:
        return NoisyStep(call, state, widths)

    # -- phases --------------------------------------------------------------------------------------
    def draft(self, step: NoisyStep) -> None:
        """The noisy window and its input embeddings."""
        win = self.noisy_window(step.state, step.widths, step.call)
        win.embeds = step.call.adapter.embed(win.tokens, win.levels, win.noise)
        step.window, step.drafts, step.q, step.n_drafts = win, win.drafts, win.q, win.n_drafts

    def noisy_window(self, state: NoisyState, widths: list[int], call: WindowCall) -> NoisyWindow:
        """[last committed, carried drafts (noisy), forced tokens (clean), pure noise] per row."""
        levels = state.levels
        layout, device, B, W = call.layout, call.device, len(widths), max(widths)
        V, D, noise_level = layout.vocab_size, call.adapter.embed_dim, call.adapter.noise_levels - 1
        forced = layout.forced_on(device)
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
            noise[b, :w] = torch.randn(w, D, generator=call.generators[b], device=device)
        return NoisyWindow(tokens, in_levels, noise, drafts, q, n_drafts)

    def forward(self, step: NoisyStep) -> None:
        """The embeddings against the cache; output i of row b predicts position committed[b] + i."""
        call, committed, win = step.call, step.state.committed, step.window
        step.logits = call.clock.forward_embeds(win.embeds, win.levels, [n - 1 for n in committed])
        offsets = torch.arange(win.tokens.shape[1], device=call.device)
        step.positions = torch.as_tensor(committed, device=call.device)[:, None] + offsets
        step.p = self.kernels.pipeline(step.logits, step.positions, call.layout, call.sampling)

    def verify(self, step: NoisyStep) -> None:
        """SJD's speculative rule up to the first slot without a draft; the model's samples everywhere."""
        p, win = step.p, step.window
        u_accept, u_jacobi = draw_uniforms(step.call.generators, step.widths, p.shape[1], p.device)
        u_final = u_accept.gather(1, win.n_drafts[:, None]).squeeze(1)
        step.result = self.kernels.verify(p, win.drafts, win.q, win.n_drafts, u_accept[:, :-1], u_final)
        step.samples = sample_from(p, u_jacobi)

    def commit(self, step: NoisyStep) -> None:
        """SJD's commit; each carried draft then enters the next forward one denoising step cleaner."""
        step.state.commit(step.result, step.drafts, step.samples, step.p, step.widths)
        self.carry_levels(step.state, step.window, step.widths, step.call.adapter.noise_levels - 1)

    def carry_levels(self, state: NoisyState, win: NoisyWindow, widths: list[int], noise_level: int) -> None:
        """After the commit: each carried draft enters the next forward one denoising step cleaner."""
        levels = state.levels
        for b in range(len(widths)):
            if widths[b] == 0:
                continue
            take = state.accepted[b][-1]
            old = win.levels[b, take + 1 : widths[b] + 1]  # the level each carried position entered at
            fill = torch.full((len(state.carried[b]) - len(old),), noise_level, device=old.device)
            levels[b] = self.next_level(torch.cat([old, fill]), noise_level)
