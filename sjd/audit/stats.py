"""Exactness audit: are a decoder's samples distributed as AR's?

Two tests, both pure functions of sample arrays:
- `exact_test`: when the output space can be enumerated (the micro model), the exact AR
  probability of every image is computed by teacher forcing through the shared pipeline, and
  the decoder's counts get a chi-square goodness-of-fit test against it;
- `marginal_test`: on a model too big to enumerate (the toy), a two-sample chi-square test per
  generated position between the decoder's and AR's samples, Bonferroni-combined.
Bins whose expected count is below 5 are pooled, as the chi-square approximation requires.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from sjd.core.sampling import SamplingConfig, logits_to_probs
from sjd.core.seeding import make_generators
from sjd.decoders.base import Decoder
from sjd.models.base import ModelAdapter
from sjd.types import Logits, Prompt

MIN_EXPECTED = 5.0


@dataclass
class AuditResult:
    tv_distance: float
    p_value: float  # NaN when nothing could be tested: an untested audit passes nothing
    dof: int
    n_tested: int = 0  # outcomes (exact test) or positions (two-sample test) the p-value covers


def draw_samples(
    decoder: Decoder,
    adapter: ModelAdapter,
    sampling: SamplingConfig,
    prompt: str,
    n: int,
    batch_size: int,
    seed: int,
    tag: str,
) -> torch.Tensor:
    """n sequences for one caption, each with its own generator seeded from (seed, tag + index)."""
    out = []
    for start in range(0, n, batch_size):
        ids = [f"{tag}{i}" for i in range(start, min(start + batch_size, n))]
        prompts = [Prompt(i, prompt) for i in ids]
        out.append(decoder.generate(adapter, prompts, sampling, make_generators(seed, ids, adapter.device)).tokens)
    return torch.cat(out)


def enumerate_images(adapter: ModelAdapter) -> torch.Tensor:
    """Every token sequence the grammar allows: [n_outcomes, n_tokens]."""
    layout = adapter.layout
    free_positions = (layout.forced < 0).nonzero().flatten().tolist()
    free_ids = layout.free_token_ids.tolist()
    rows = []
    for combo in itertools.product(free_ids, repeat=len(free_positions)):
        seq = layout.forced.clone()
        seq[free_positions] = torch.tensor(combo)
        rows.append(seq)
    return torch.stack(rows)


@torch.no_grad()
def sequence_probabilities(
    adapter: ModelAdapter, prompt: Prompt, sequences: torch.Tensor, sampling: SamplingConfig
) -> torch.Tensor:
    """Exact AR probability of each sequence under the shared logits pipeline."""
    B, N = sequences.shape
    first = adapter.prefill([prompt] * B, sampling.uses_uncond)
    rest = adapter.forward(sequences[:, :-1].to(adapter.device), [0] * B)
    uncond = None if first.uncond is None else torch.cat([first.uncond, rest.uncond], 1)
    logits = Logits(torch.cat([first.cond, rest.cond], 1), uncond)
    positions = torch.arange(N, device=adapter.device).expand(B, -1)
    probs = logits_to_probs(logits, positions, adapter.layout, sampling).double()
    return probs.gather(-1, sequences[..., None].to(adapter.device)).squeeze(-1).prod(-1).cpu()


def _pooled_chi_square(observed: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """Chi-square statistic after pooling bins with expected count < MIN_EXPECTED."""
    small = expected < MIN_EXPECTED
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat, len(exp) - 1


def exact_test(counts: np.ndarray, probs: np.ndarray) -> AuditResult:
    """Goodness of fit of outcome `counts` to the exact distribution `probs`."""
    from scipy import stats  # here, not at the top: every run imports this module, and only an audit needs scipy

    n = counts.sum()
    probs = probs / probs.sum()
    stat, dof = _pooled_chi_square(counts.astype(float), n * probs)
    tv = 0.5 * float(np.abs(counts / n - probs).sum())
    return AuditResult(tv, float(stats.chi2.sf(stat, dof)) if dof > 0 else float("nan"), dof, len(probs))


def marginal_test(samples: np.ndarray, reference: np.ndarray) -> AuditResult:
    """Per-position two-sample chi-square of [n, N] token arrays; Bonferroni over positions.
    tv_distance is the mean over positions of the marginals' total-variation distance. With no
    position testable (too few samples) the p-value is NaN, not 1."""
    from scipy import stats  # as in exact_test

    p_values, tvs, dofs = [], [], 0
    for pos in range(samples.shape[1]):
        ids = np.union1d(samples[:, pos], reference[:, pos])
        if len(ids) < 2:
            continue  # a forced position: identical by construction
        a = np.array([(samples[:, pos] == i).sum() for i in ids], float)
        b = np.array([(reference[:, pos] == i).sum() for i in ids], float)
        tvs.append(0.5 * np.abs(a / a.sum() - b / b.sum()).sum())
        keep = (a + b) >= 2 * MIN_EXPECTED
        # Rare ids are pooled by id into as many bins as their count fills (at least one): at high entropy
        # most ids are rare, and one pooled bin would leave the test nothing to compare.
        n_pools = max(1, int((a[~keep] + b[~keep]).sum() // (2 * MIN_EXPECTED)))
        pool = ids[~keep] % n_pools
        rare_a = np.bincount(pool, weights=a[~keep], minlength=n_pools)
        rare_b = np.bincount(pool, weights=b[~keep], minlength=n_pools)
        table = np.stack([np.append(a[keep], rare_a), np.append(b[keep], rare_b)])
        table = table[:, table.sum(0) > 0]
        if table.shape[1] < 2:
            continue
        chi2, p, dof, _ = stats.chi2_contingency(table, correction=False)
        p_values.append(p)
        dofs += dof
    if not p_values:
        return AuditResult(float(np.mean(tvs)) if tvs else float("nan"), float("nan"), 0, 0)
    p = float(min(1.0, min(p_values) * len(p_values)))
    return AuditResult(float(np.mean(tvs)), p, dofs, len(p_values))


def outcome_index(sequences: torch.Tensor, enumerated: torch.Tensor) -> np.ndarray:
    """Map each sampled sequence to its row in `enumerated` (error if the grammar was broken)."""
    lookup = {tuple(r): i for i, r in enumerate(enumerated.tolist())}
    idx = [lookup.get(tuple(r)) for r in sequences.tolist()]
    if any(i is None for i in idx):
        raise AssertionError("a sampled sequence is outside the grammar's output space")
    return np.asarray(idx)
