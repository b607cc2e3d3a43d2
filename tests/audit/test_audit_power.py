"""The one-sample audit's power, measured on synthetic categorical sequences with known faults.

Each position of a 16 x 16 "image" has its own random distribution p over 32 ids, with entropies
spread from near 0 to a few nats. An exact sampler draws from p; a faulty one draws from a mixture
of p with its argmax (greedier) or with the uniform distribution (flatter), mixed so that its expected
surprisal excess is exactly +-EXCESS nats a token. The faults differ in where the sign falls:
- everywhere greedier (what Z is sized for: `tokens_for_power`);
- greedier at low entropy, flatter at high entropy (a sign predictable from the entropy);
- greedier in the top half of the image, flatter in the bottom (predictable from the position);
- greedier or flatter by a hidden coin at each position (predictable from nothing).
The last three keep the mean excess near 0, so Z alone cannot see them. docs/algorithms.md ("What it
has power against") states what these tests assert."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import stats

from sjd.audit.teacher_forced import (
    ALPHA,
    STATISTICS,
    TokenTerms,
    exactness_statistics,
    pit_uniforms,
    position_terms,
    tokens_for_power,
    tokens_for_split_power,
)

V, SIDE = 32, 16
T = SIDE * SIDE
GRID = SimpleNamespace(tested=np.ones(T, bool), row=np.arange(T) // SIDE, row_stride=SIDE)
EXCESS = 0.05  # nats a token: 5 times the stated size, so the samples are 25 times smaller
TRIALS = 30


def _distributions(rng: np.random.Generator, n_images: int) -> np.ndarray:
    logits = rng.normal(size=(n_images, T, V)) * rng.uniform(0.5, 2.5, size=(n_images, T, 1))
    p = np.exp(logits)
    return p / p.sum(-1, keepdims=True)


def _entropy(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(p)).sum(-1)


def _faulty(p: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """q with surprisal excess sign * EXCESS at each position (0: q = p), or as near as a mixture gets."""
    greedy = np.zeros_like(p)
    np.put_along_axis(greedy, p.argmax(-1)[..., None], 1.0, -1)
    target = np.where(sign[..., None] < 0, greedy, np.full_like(p, 1.0 / V))
    gap = (target * -np.log(p)).sum(-1) - _entropy(p)  # the excess of drawing from the target alone
    w = np.clip(EXCESS / np.abs(gap), 0.0, 1.0)[..., None] * (sign[..., None] != 0)
    return (1 - w) * p + w * target


def _signs(fault: str, p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    h = _entropy(p)
    if fault == "exact":
        return np.zeros(h.shape)
    if fault == "greedier":
        return -np.ones(h.shape)
    if fault == "split_by_entropy":
        return np.where(h < np.median(h), -1.0, 1.0)
    if fault == "split_by_position":
        return np.broadcast_to(np.where(np.arange(T) < T // 2, -1.0, 1.0), h.shape).copy()
    if fault == "hidden_coin":
        return rng.choice([-1.0, 1.0], size=h.shape)
    raise ValueError(fault)


def _audit(fault: str, n_images: int, rng: np.random.Generator, trial: int) -> dict:
    p = _distributions(rng, n_images)
    q = _faulty(p, _signs(fault, p, rng))
    x = (q.cumsum(-1) > rng.random((n_images, T, 1))).argmax(-1)
    free = SimpleNamespace(free_columns=lambda device: slice(0, V))
    terms = TokenTerms(*position_terms(torch.from_numpy(p), torch.from_numpy(x), free))
    return exactness_statistics(terms, pit_uniforms(terms, range(trial * n_images, (trial + 1) * n_images)), GRID)


def _variance_per_token() -> float:
    p = _distributions(np.random.default_rng(99), 8)
    return float(((p * np.log(p) ** 2).sum(-1) - _entropy(p) ** 2).mean())


def _detection_rates(fault: str, tokens: float, seed: int) -> dict[str, float]:
    """Share of TRIALS audits whose combined p (and each family member's Bonferroni share) is <= ALPHA."""
    rng = np.random.default_rng(seed)
    n_images = int(np.ceil(tokens / T))
    k = len(STATISTICS)
    hits = {"combined": 0, "z": 0, "entropy_strata": 0, "position_strata": 0}
    for trial in range(TRIALS):
        out = _audit(fault, n_images, rng, trial)
        hits["combined"] += out["tf_p"] <= ALPHA
        hits["z"] += 2 * stats.norm.sf(abs(out["tf_z"])) * k <= ALPHA
        hits["entropy_strata"] += out["tf_entropy_strata_p"] * k <= ALPHA
        hits["position_strata"] += out["tf_position_strata_p"] * k <= ALPHA
    return {name: n / TRIALS for name, n in hits.items()}


def test_the_strata_statistics_are_uniform_for_an_exact_sampler():
    rng = np.random.default_rng(0)
    outs = [_audit("exact", 8, rng, trial) for trial in range(120)]
    for column in ("tf_entropy_strata_p", "tf_position_strata_p"):
        ps = [o[column] for o in outs]
        assert stats.kstest(ps, "uniform").pvalue > 1e-3, (column, ps)
    assert np.mean([o["tf_p"] <= 0.05 for o in outs]) <= 0.1  # the combined p holds its level


def test_split_power_is_the_token_count_at_which_the_strata_chi_square_reaches_its_threshold():
    n = tokens_for_split_power(2.0)
    critical = stats.chi2.isf(ALPHA / len(STATISTICS), 4)
    assert stats.ncx2.sf(critical, 4, n * 0.01**2 / 2.0) == pytest.approx(0.8, abs=1e-6)
    assert tokens_for_split_power(4.0) == pytest.approx(2 * n) and np.isnan(tokens_for_split_power(0.0))
    assert n > tokens_for_power(2.0)  # a split departure costs more tokens than a one-sided one


def test_a_greedier_sampler_is_caught_at_the_size_z_is_stated_for():
    rates = _detection_rates("greedier", tokens_for_power(_variance_per_token(), EXCESS), seed=1)
    assert rates["combined"] >= 2 / 3, rates  # 0.8 by design: Z alone, and the rest of the family adds to it


@pytest.mark.parametrize(("fault", "statistic"), [("split_by_entropy", "entropy_strata"),
                                                  ("split_by_position", "position_strata")])  # fmt: skip
def test_a_split_fault_is_invisible_to_z_and_caught_by_its_strata_at_the_split_size(fault, statistic):
    rates = _detection_rates(fault, tokens_for_split_power(_variance_per_token(), EXCESS), seed=2)
    assert rates["z"] <= 0.1, rates  # opposite signs cancel in the mean
    assert rates[statistic] >= 2 / 3 and rates["combined"] >= 2 / 3, rates  # 0.8 by design


def test_a_sign_chosen_by_a_hidden_coin_is_invisible_at_the_split_size():
    """The blind spot the docs name: no statistic of p, entropy or position predicts the sign. Two controls
    show that nothing else makes it invisible: the coin's sampler departs from p by the full EXCESS at every
    position, and the same departure with its signs placed by the entropy instead of the coin is caught by
    the same audit, at the same size and seed."""
    p = _distributions(np.random.default_rng(3), 8)
    q = _faulty(p, _signs("hidden_coin", p, np.random.default_rng(4)))
    excess = (q * -np.log(p)).sum(-1) - _entropy(p)
    assert np.abs(excess).mean() == pytest.approx(EXCESS, rel=0.05)  # a real departure, of the stated size
    assert abs(excess.mean()) < EXCESS / 5  # whose signs cancel in the mean
    tokens = tokens_for_split_power(_variance_per_token(), EXCESS)
    rates = _detection_rates("hidden_coin", tokens, seed=3)
    assert rates["combined"] <= 0.2, rates
    visible = _detection_rates("split_by_entropy", tokens, seed=3)
    assert visible["combined"] >= 2 / 3, visible  # the audit is not blind at this size
