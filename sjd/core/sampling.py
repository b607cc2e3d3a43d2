"""The one logits pipeline every decoder uses, and sampling with per-prompt generators.

logits -> CFG mix -> grammar -> temperature -> top-k / top-p -> probabilities (float32).

All functions are pure and vectorised over a window [B, W, V]. Because AR and every
speculative decoder call the same `logits_to_probs`, "lossless" is a statement about the
same distribution. Temperature 0 is greedy: a one-hot distribution on the arg-max, which
the speculative rules then accept or reject deterministically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sjd.types import ImageLayout, Logits


@dataclass(frozen=True)
class SamplingConfig:
    cfg_scale: float = 3.0  # 1.0 (or 0 unconditional rows) turns guidance off
    temperature: float = 1.0  # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.cfg_scale < 0:
            raise ValueError(f"model.sampling.cfg_scale must be >= 0, got {self.cfg_scale}")
        if self.temperature < 0:
            raise ValueError(f"model.sampling.temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"model.sampling.top_k must be >= 1 or null, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"model.sampling.top_p must be in (0, 1] or null, got {self.top_p}")

    @property
    def uses_uncond(self) -> bool:
        return self.cfg_scale != 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def cfg_mix(logits: Logits, scale: float) -> torch.Tensor:
    """Guided logits `uncond + scale * (cond - uncond)`; the conditional ones without CFG."""
    if logits.uncond is None or scale == 1.0:
        return logits.cond
    return logits.uncond + scale * (logits.cond - logits.uncond)


def grammar_mask(positions: torch.Tensor, layout: ImageLayout) -> torch.Tensor:
    """[B, W] generated positions -> [B, W, V] allowed-token mask (forced tokens one-hot).

    Positions past the image (padding slots of a window) get the free-token mask; decoders
    never use their outputs."""
    table = layout.allowed_table(positions.device)
    return table[positions.clamp(0, layout.n_tokens)]


def filter_top_k_top_p(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def logits_to_probs(
    logits: Logits, positions: torch.Tensor, layout: ImageLayout, sampling: SamplingConfig
) -> torch.Tensor:
    """The shared pipeline: [B, W, V] logits at generated `positions` [B, W] -> probabilities."""
    guided = cfg_mix(logits, sampling.cfg_scale).float()
    guided = guided.masked_fill(~grammar_mask(positions, layout), float("-inf"))
    if sampling.greedy:
        return torch.nn.functional.one_hot(guided.argmax(-1), guided.shape[-1]).float()
    if sampling.temperature != 1.0:
        guided = guided / sampling.temperature
    guided = filter_top_k_top_p(guided, sampling.top_k, sampling.top_p)
    return guided.softmax(-1)


# -- randomness: one generator per prompt, so a prompt's draws never depend on its batch --------
def sample_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: probs [..., V], uniforms [...] in [0, 1) -> ids [...].

    Zero-probability ids are never returned: the target is kept strictly below the CDF's
    total, so rounding at the top cannot fall through to a masked id at the end."""
    cdf = probs.cumsum(-1)
    total = cdf[..., -1:]
    target = torch.minimum(uniforms.unsqueeze(-1) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


def sample_rows(probs: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One sample per distribution of each row: probs [B, ..., V] with generator b for row b."""
    shape = probs.shape[1:-1]
    u = torch.stack([torch.rand(shape, generator=g, device=probs.device) for g in generators])
    return sample_from(probs, u)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats along the last axis."""
    return -(probs * probs.clamp_min(1e-30).log()).sum(-1)
