"""The one logits pipeline every decoder uses, and sampling with per-prompt generators.

logits -> grammar (free columns) -> CFG mix -> temperature -> top-k / top-p -> probabilities (float32).

All functions are pure and vectorised over a window [B, W, V]. Because AR and every
speculative decoder call the same `logits_to_probs`, "lossless" is a statement about the
same distribution. Temperature 0 is greedy: a one-hot distribution on the arg-max, which
the speculative rules then accept or reject deterministically.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
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


def filter_top_k_top_p(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Mask to -inf every logit outside the top-k ids and outside the smallest top-p nucleus.

    Both filters cut at a value, so ties are treated alike: every id tied with the k-th largest
    logit is kept (more than k ids can survive), and every id tied with the last id the nucleus
    needs is kept. The cuts are found on the k largest values only, never by a full sort."""
    n = logits.shape[-1]
    k = top_k if top_k is not None and top_k < n else None
    nucleus = top_p is not None and top_p < 1.0
    if k is None and not nucleus:
        return logits
    top = largest_values(logits, k if k is not None else n, ordered=nucleus)  # [..., m]
    if k is not None:
        kth = top[..., -1:] if nucleus else top.amin(-1, keepdim=True)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if nucleus:
        # Probabilities of the sorted survivors, normalised over all of them (ties past the k-th included).
        peak = top[..., :1]
        total = (logits - peak).exp().sum(-1, keepdim=True)
        p_sorted = (top - peak).exp() / total
        needed = ((p_sorted.cumsum(-1) - p_sorted) < top_p).sum(-1, keepdim=True)  # keep the id that crosses top_p
        cut = top.gather(-1, needed - 1)
        logits = logits.masked_fill(logits < cut, float("-inf"))
    return logits


def largest_values(x: torch.Tensor, m: int, ordered: bool) -> torch.Tensor:
    """The m largest values along the last axis (descending when `ordered`).

    On CPU, torch.topk with a large k (2000 of 8192) is an order of magnitude slower than numpy's
    introselect, so the CPU path partitions with numpy; the values are the same."""
    if x.device.type != "cpu" or x.dtype == torch.bfloat16 or torch.compiler.is_compiling():  # no numpy in a graph
        return torch_largest_values(x, m, ordered)
    n = x.shape[-1]
    a = x.detach().numpy()
    top = np.partition(a, n - m, axis=-1)[..., n - m :] if m < n else a
    if ordered:
        top = -np.sort(-top, axis=-1)  # descending (negation is exact)
    return torch.from_numpy(np.ascontiguousarray(top))


def torch_largest_values(x: torch.Tensor, m: int, ordered: bool) -> torch.Tensor:
    if m == x.shape[-1]:
        return torch.sort(x, dim=-1, descending=True).values if ordered else x
    return torch.topk(x, m, dim=-1, sorted=ordered).values


def logits_to_probs(
    logits: Logits,
    positions: torch.Tensor,
    layout: ImageLayout,
    sampling: SamplingConfig,
    on_free_columns: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """The shared pipeline: [B, W, V] logits at generated `positions` [B, W] -> probabilities [B, W, V].

    The grammar allows either one forced id or the free ids at every position, so CFG,
    temperature and top-k / top-p run on the free columns only (a view when the image codes are
    one id range) and the result is scattered back: forced positions are one-hot, ids outside
    the free set get probability 0. Equal to masking the full vocabulary first (tests keep that
    implementation as the reference). The layout's tables are read here, on the host side; the tensor work is
    `probs_on_free_columns`, or the compiled copy of it compile=true passes as `on_free_columns`
    (sjd.decoders.kernels)."""
    device = positions.device
    kernel = probs_on_free_columns if on_free_columns is None else on_free_columns
    return kernel(
        logits.cond, logits.uncond, positions, layout.forced_table(device), layout.free_columns(device), sampling
    )


def probs_on_free_columns(
    cond: torch.Tensor,
    uncond: torch.Tensor | None,
    positions: torch.Tensor,
    forced_table: torch.Tensor,
    cols: slice | torch.Tensor,
    sampling: SamplingConfig,
) -> torch.Tensor:
    """`logits_to_probs` after the layout's tables are read: tensors and constants only, so it compiles into one
    graph. `forced_table` [n_tokens + 1] holds the forced id at each position (-1: free, and the padding row)."""
    forced = forced_table[positions.clamp(0, forced_table.shape[0] - 1)]  # [B, W], -1 = free
    is_forced = (forced >= 0)[..., None]
    free = Logits(cond[..., cols], None if uncond is None else uncond[..., cols])
    guided = cfg_mix(free, sampling.cfg_scale).float()  # [B, W, F]
    V = cond.shape[-1]
    if sampling.greedy:
        best = free_ids(cols, guided.argmax(-1))
        return torch.nn.functional.one_hot(torch.where(forced >= 0, forced, best), V).float()
    if sampling.temperature != 1.0:
        guided = guided / sampling.temperature
    guided = filter_top_k_top_p(guided, sampling.top_k, sampling.top_p)
    compact = guided.softmax(-1).masked_fill_(is_forced, 0.0)
    if guided.shape[-1] == V:  # every id is free
        probs = compact
    else:
        probs = compact.new_zeros(*compact.shape[:-1], V)
        probs[..., cols] = compact
    return probs.scatter_add_(-1, forced.clamp(min=0)[..., None], is_forced.float())


def free_ids(cols: slice | torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Vocabulary ids of positions `index` in the free columns."""
    return index + cols.start if isinstance(cols, slice) else cols[index]


# -- randomness: one generator per prompt, so a prompt's draws never depend on its batch --------
def sample_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: probs [..., V], uniforms [...] in [0, 1) -> ids [...].

    Zero-probability ids are never returned: the target is kept strictly below the CDF's
    total, so rounding at the top cannot fall through to a masked id at the end. The clamp changes nothing
    for finite probs; for NaN ones (a model gone non-finite, caught when the decoder next reads a count on
    the host: sjd.decoders.base.ForwardClock.read) it keeps the id in range, so nothing indexes past the
    vocabulary on the device before that read."""
    cdf = probs.cumsum(-1)
    total = cdf[..., -1:]
    target = torch.minimum(uniforms.unsqueeze(-1) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


def sample_rows(probs: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One sample per distribution of each row: probs [B, ..., V] with generator b for row b."""
    return sample_from(probs, row_uniforms(generators, probs.device, probs.shape[1:-1]))


def row_uniforms(
    generators: Sequence[torch.Generator], device: torch.device, shape: Sequence[int] = ()
) -> torch.Tensor:
    """[B, *shape] uniforms in [0, 1), row b's from generator b (what `sample_rows` draws)."""
    return torch.stack([torch.rand(tuple(shape), generator=g, device=device) for g in generators])
