"""The logits pipeline and finite check that sjd.core.sampling and sjd.decoders.base replaced, kept verbatim: the
grammar mask over the full vocabulary, then CFG, temperature, top-k / top-p and softmax over all V ids, and a
per-row scan of every logit for NaN or inf (check_finite; finite_rows gives the same scan's flags for a decoder
that reads its checks late). tests/core/test_logits_pipeline.py holds today's pipeline to these probabilities;
the pipeline bench (sjd/bench/pipeline.py) times the two against each other.
"""

import torch

from sjd.core.sampling import SamplingConfig
from sjd.types import ImageLayout, Logits


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


def check_finite(logits: Logits, model: str, prompt_ids, step: int) -> None:
    """The finite check before the single reduction: a per-row scan of the full vocabulary."""
    for branch, t in (("conditional", logits.cond), ("unconditional", logits.uncond)):
        if t is None:
            continue
        bad = (~torch.isfinite(t)).flatten(1).any(1)
        if bool(bad.any()):
            raise FloatingPointError(f"model {model!r} returned NaN/inf {branch} logits at forward {step}")


def finite_rows(logits: Logits) -> torch.Tensor:
    """[B] whether each row's logits are finite, by the same per-row scan of the full vocabulary (the flags that a
    decoder reading its finite checks late keeps)."""
    rows = [(~torch.isfinite(t)).flatten(1).any(1) for t in (logits.cond, logits.uncond) if t is not None]
    return ~torch.stack(rows).any(0)
