"""Coupled speculative Jacobi decoding: SJD whose drafts stay put between iterations.

SJD redraws every carried draft independently from the latest p at each iteration, so a
position's draft changes almost every time (the SCD paper measures how often) even when p barely moved, and
the positions after it see a new prefix again. A *coupling* keeps each new draft distributed
exactly as p at its slot (its q, so verification stays exact) while making it equal to the old
draft whenever it can (docs/algorithms.md §5):

- `coupling: gumbel` (SCD-GS): one Gumbel vector per absolute position, drawn once per image
  and reused at every iteration: draft = argmax(log p + g_pos). A position's Gumbel vector is
  never looked at by any test before the position is first verified for commitment, so each
  draft is, given everything verification has seen, a fresh sample of p.
- `coupling: maximal` (SCD-MC; the same loop as SJD-PAC's adaptive continuation): verification
  does not stop at the first rejection. Every later draft goes through its own accept test
  against the new p (u * q(d) < p(d)) and is kept if accepted, else replaced by a sample of
  norm(max(0, p - q)). The result is distributed as p (the speculative-sampling identity), so
  its q is p, not the old q: keeping the old q for a kept draft, as one released file does,
  would bias later tests. Only the prefix before the first rejection is committed, as in SJD.
- `coupling: none` is SJD.

Why it is exact (a sketch): causality means nothing at positions <= j depends on position
j+1's randomness (its Gumbel vector, its test uniforms, its residual draws). Given all of that,
the draft at j+1 follows a chain whose marginal at every iteration is the q it is verified
with; so when position j+1 is first tested for commitment, the standard speculative-sampling
argument applies. The exactness audit (scripts/audit.py) checks this at N >= 20,000.

The decoder is SJD's loop (sjd.decoders.sjd) with only `next_drafts` replaced (the `Coupled` part, which
SJD-PAC, sjd.decoders.sjd_pac, holds too); the other parts
of our combination are SJD's: `init` (drafts from the row above: by default `vertical_dist`, a draw
from the distribution the committed code above came from, sjd.core.drafts) and `forced_drafts`.
Gumbel and maximal coupling do not compose: a residual drawn with the Gumbel vector that drew
the rejected draft is biased by the rejection, so `coupling` is one choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sjd.core.sampling import sample_from
from sjd.core.verify import residual
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.window import WindowCall, WindowStep
from sjd.decoders.window_state import WindowState

COUPLINGS = ("none", "gumbel", "maximal")


@dataclass(eq=False, kw_only=True)
class Coupled:
    """The coupling part, before a decoder on SJD's loop in its bases (coupled SJD, SJD-PAC): its settings and the
    two hooks it fills, `begin` (Gumbel vectors) and `next_drafts`. A part rather than a parent, so a decoder that
    couples its drafts is one level below SJD, not two."""

    init: str = "vertical_dist"
    coupling: str = "maximal"
    verification: str = field(default="token", init=False)  # a coupling keeps the token rule (SJD's docstring)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.coupling not in COUPLINGS:
            raise ValueError(f"decoder.coupling must be one of {COUPLINGS}, got {self.coupling!r}")

    def begin(self, state: WindowState, call: WindowCall) -> None:
        super().begin(state, call)
        if self.coupling != "gumbel":
            return
        # One Gumbel vector per (row, generated position), from the row's own generator so a
        # row's tokens do not depend on the rest of the batch. Memory: B x N x V floats (stated
        # in conf/decoder/csjd.yaml).
        N, V, device = call.layout.n_tokens, call.layout.vocab_size, state.tokens.device
        u = torch.stack([torch.rand(N + 1, V, generator=g, device=device) for g in call.generators])
        state.noise = -torch.log(-torch.log(u.clamp(1e-20, 1 - 1e-7)))

    def next_drafts(self, step: WindowStep, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = step.p
        if self.coupling == "gumbel":
            samples = self.kernels(gumbel_argmax)(p, gumbel_noise_at(step.state.noise, step.positions))
        elif self.coupling == "maximal" and step.drafts.shape[1]:
            samples = self.kernels(maximal_coupling_next)(
                p, step.drafts, step.q, step.n_drafts, step.result.accepted, uniforms
            )
        else:
            samples = self.kernels.sample_from(p, uniforms)  # nothing to couple with
        return samples, p


@dataclass(eq=False, kw_only=True)
class CoupledSJDDecoder(Coupled, SJDDecoder):
    name: str = "csjd"


def maximal_coupling_next(
    p: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor,
    n_drafts: torch.Tensor,
    accepted: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """[B, W] the next drafts under maximal coupling: `maximal_coupling_drafts`, with a fresh sample of p at the
    bonus slot and the padding, where there is nothing to couple with (one kernel under compile=true)."""
    fresh = sample_from(p, uniforms)
    return maximal_coupling_drafts(p, drafts, q, n_drafts, accepted, uniforms, fresh)


def gumbel_drafts(p: torch.Tensor, noise: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B, W] argmax(log p + g) with g the fixed Gumbel vector of each slot's position.

    p [B, W, V], noise [B, N + 1, V] (the last row serves window padding past the image)."""
    return gumbel_argmax(p, gumbel_noise_at(noise, positions))


def gumbel_noise_at(noise: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B, W, V] the Gumbel vectors of the slots' positions (read outside the compiled kernel, so a graph
    replay copies the window's vectors, not the image's)."""
    rows = torch.arange(noise.shape[0], device=noise.device)[:, None]
    return noise[rows, positions.clamp(max=noise.shape[1] - 1)]


def gumbel_argmax(p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """[B, W] argmax(log p + g)."""
    return (p.log() + g).argmax(-1)  # log 0 = -inf: ids outside the support never win


def maximal_coupling_drafts(
    p: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor,
    n_drafts: torch.Tensor,
    accepted: torch.Tensor,
    uniforms: torch.Tensor,
    fresh: torch.Tensor,
) -> torch.Tensor:
    """[B, W]: each draft slot keeps its draft if its own accept test passed, else a residual
    sample; slots without a draft take `fresh`. `accepted` [B, D] are the per-draft outcomes of
    sjd.core.verify (each test independent of the earlier ones), uniforms [B, W]."""
    D = drafts.shape[1]
    redrawn = sample_from(residual(p[:, :D], q), uniforms[:, :D])
    kept = torch.where(accepted, drafts, redrawn)
    has_draft = torch.arange(D, device=p.device)[None, :] < n_drafts[:, None]
    out = fresh.clone()
    out[:, :D] = torch.where(has_draft, kept, fresh[:, :D])
    return out
