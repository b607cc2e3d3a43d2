"""The one-sample, teacher-forced exactness audit: does each sampled image look like a draw from AR?

One teacher-forced forward per image, through the adapter and the shared logits pipeline under the
run's sampling settings, gives p_t(. | x_<t) at every generated position. If x was drawn from the AR
model, then (docs/algorithms.md, "The one-sample audit"):
- the randomized probability integral transform U_t = P_t(ids ranked above x_t) + V_t p_t(x_t), ids
  ranked by descending p_t (ties by id), V_t uniform and independent of x, makes U_1 .. U_T independent
  and uniform on (0, 1);
- the surprisal excess d_t = -log p_t(x_t) - H(p_t) has mean 0 given the past and variance
  Var_t = sum p log^2 p - H^2, so Z = sum d_t / sqrt(sum Var_t) is close to standard normal, and so is
  the same sum taken over any class of positions (an entropy quartile, a band of image rows).

`teacher_forced_tokens` runs the forwards (batched) and keeps four numbers per position; everything
after it is a pure function of those numbers. Forced positions (p = 1) carry no information and are
left out; so are free positions where the distribution is one point (top-k = 1), which test nothing.

scipy is imported inside the functions that test, not here: every run imports this module (through
sjd.audit.in_run), and scipy.stats costs a process about a second that only an audit needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from sjd.core.sampling import SamplingConfig, logits_to_probs
from sjd.models.base import ModelAdapter
from sjd.types import ImageLayout, Logits, Prompt

ALPHA = 1e-3  # a lossless decoder passes when the combined p exceeds this
POWER_EXCESS = 0.01  # nats per token: the excess the reported power is for
# the Bonferroni family of the combined p
STATISTICS = ("z", "ks", "row_ks", "lag1", "lag_row", "entropy_strata", "position_strata")
N_STRATA = 4  # entropy quartiles; bands of image rows
PIT_STREAM = 0x5049_5400  # seeds V_t apart from every stream a decoder draws from the same seed


@dataclass
class TokenTerms:
    """Per image and generated position, [n_images, n_tokens] float64 arrays."""

    p_token: np.ndarray  # p_t(x_t)
    p_above: np.ndarray  # P_t(ids ranked above x_t)
    entropy: np.ndarray  # H(p_t) in nats
    second: np.ndarray  # sum p log^2 p
    # True where p_t(x_t) = 0 only because x_t ties the top-k cutoff to float precision (cutoff_ties): a token
    # at the cutoff in the decode's forward can fall just past it in this one, whose sums run in another order
    tie: np.ndarray | None = field(default=None)

    def ties(self) -> np.ndarray:
        return np.zeros(self.p_token.shape, dtype=bool) if self.tie is None else self.tie


POSITION_CHUNK = 128  # positions per float64 pass: bounds the audit's memory at a large vocabulary


@torch.no_grad()
def position_terms(probs: torch.Tensor, tokens: torch.Tensor, layout: ImageLayout) -> list[np.ndarray]:
    """probs [B, N, V] and committed tokens [B, N] -> p(x), P(ranked above x), H, sum p log^2 p (float64).

    Computed on the free columns only (forced positions are one-hot: p(x) = 1 there when the grammar
    was kept, every other term 0), a chunk of positions at a time."""
    cols = layout.free_columns(probs.device)
    free = probs[..., cols]
    col_of = torch.full((probs.shape[-1],), -1, dtype=torch.long, device=probs.device)
    col_of[cols] = torch.arange(free.shape[-1], device=probs.device)
    out = []
    for s in range(0, probs.shape[1], POSITION_CHUNK):
        tok = tokens[:, s : s + POSITION_CHUNK]
        p = free[:, s : s + POSITION_CHUNK].double()
        idx = col_of[tok]
        px_free = p.gather(-1, idx.clamp(min=0)[..., None]).squeeze(-1).masked_fill(idx < 0, 0.0)
        px = torch.maximum(px_free, probs[:, s : s + POSITION_CHUNK].gather(-1, tok[..., None]).squeeze(-1).double())
        ids = torch.arange(p.shape[-1], device=p.device)
        above = (p > px_free[..., None]) | ((p == px_free[..., None]) & (ids < idx[..., None]))
        logp = p.clamp_min(1e-300).log().masked_fill(p == 0, 0.0)
        terms = (px, (p * above).sum(-1), -(p * logp).sum(-1), (p * logp.square()).sum(-1))
        out.append([t.cpu().numpy() for t in terms])
    return [np.concatenate([o[i] for o in out], 1) for i in range(4)]


@torch.no_grad()
def teacher_forced_tokens(
    adapter: ModelAdapter,
    prompts: Sequence[Prompt],
    tokens: torch.Tensor,
    sampling: SamplingConfig,
    batch_size: int,
) -> TokenTerms:
    """One teacher-forced forward per image (prompt b, tokens [B, N]) in batches of `batch_size`, at the
    adapter's own dtype and path: prefill, then one forward of the whole sequence but its last token."""
    parts, ties = [], []
    N = tokens.shape[1]
    for start in range(0, len(prompts), batch_size):
        seq = tokens[start : start + batch_size].to(adapter.device)
        B = len(seq)
        first = adapter.prefill(list(prompts[start : start + B]), sampling.uses_uncond)
        rest = adapter.forward(seq[:, :-1], [0] * B)
        uncond = None if first.uncond is None else torch.cat([first.uncond, rest.uncond], 1)
        logits = Logits(torch.cat([first.cond, rest.cond], 1), uncond)
        positions = torch.arange(N, device=adapter.device).expand(B, -1)
        probs = logits_to_probs(logits, positions, adapter.layout, sampling)
        parts.append(position_terms(probs, seq, adapter.layout))
        ties.append(cutoff_ties(logits, positions, seq, parts[-1][0], adapter.layout, sampling))
    return TokenTerms(*(np.concatenate([p[i] for p in parts]) for i in range(4)), np.concatenate(ties))


TIE_RTOL = 1e-4  # a probability within this fraction of the k-th largest ties it: float32 forwards differ ~1e-6


@torch.no_grad()
def cutoff_ties(
    logits: Logits,
    positions: torch.Tensor,
    tokens: torch.Tensor,
    p_token: np.ndarray,
    layout: ImageLayout,
    sampling: SamplingConfig,
) -> np.ndarray:
    """[B, N] True where a committed token has p = 0 under top-k only because it ties the k-th largest
    probability (within TIE_RTOL) of the same pipeline without top-k. The decode's forward saw the same logits
    summed in another order; at a near-tie the two can rank the token on either side of the cutoff. Only the
    rare zero positions are recomputed."""
    tie = np.zeros(p_token.shape, dtype=bool)
    if sampling.top_k is None:
        return tie
    at = np.argwhere(p_token <= 0)
    if not len(at):
        return tie
    b, t = (torch.as_tensor(at[:, i], device=positions.device) for i in (0, 1))
    uncond = None if logits.uncond is None else logits.uncond[b, t][None]
    untruncated = logits_to_probs(Logits(logits.cond[b, t][None], uncond), positions[b, t][None], layout,
                                  replace(sampling, top_k=None, top_p=None))[0]  # fmt: skip
    free = untruncated[:, layout.free_columns(untruncated.device)]
    k = min(sampling.top_k, free.shape[-1])
    kth = free.topk(k, dim=-1).values[:, -1]
    mine = untruncated.gather(-1, tokens[b, t][:, None])[:, 0]
    tie[at[:, 0], at[:, 1]] = ((mine > 0) & (mine >= kth * (1 - TIE_RTOL))).cpu().numpy()
    return tie


def pit_uniforms(terms: TokenTerms, seeds: Sequence[int]) -> np.ndarray:
    """U_t = P(above) + V_t p(x_t), with V from a generator seeded from each sample's own seed (on a
    stream of its own, so V is independent of the uniforms the decoder drew)."""
    v = np.stack([np.random.default_rng([int(s), PIT_STREAM]).random(terms.p_token.shape[1]) for s in seeds])
    return np.clip(terms.p_above + v * terms.p_token, 0.0, 1.0)


@dataclass
class CodeGrid:
    """Where the tested positions sit: [n_tokens] masks and row indices of the image codes."""

    tested: np.ndarray  # bool: a free code position
    row: np.ndarray  # int: the code row of each position (-1 off the image)
    row_stride: int


def code_grid(layout: ImageLayout) -> CodeGrid:
    free = (layout.forced < 0).numpy()
    pos = np.arange(layout.n_tokens)
    row = np.where(free, (pos - layout.first_code) // layout.row_stride, -1)
    return CodeGrid(free, row, int(layout.row_stride))


def _lag_correlation(g: np.ndarray, ok: np.ndarray, lag: int) -> tuple[float, float, int]:
    """Mean of g_t g_{t+lag} over pairs both tested, and its two-sided p: under the null the g are
    independent N(0, 1), so the sum over n pairs divided by sqrt(n) is close to N(0, 1)."""
    from scipy import stats  # imported here: see the module's note on scipy

    if lag <= 0 or lag >= g.shape[1]:
        return float("nan"), float("nan"), 0
    pair = ok[:, :-lag] & ok[:, lag:]
    prods = (g[:, :-lag] * g[:, lag:])[pair]
    n = len(prods)
    if n == 0:
        return float("nan"), float("nan"), 0
    z = prods.sum() / np.sqrt(n)
    return float(prods.mean()), float(2 * stats.norm.sf(abs(z))), n


def tokens_for_power(
    var_per_token: float, excess: float = POWER_EXCESS, alpha: float = ALPHA, power: float = 0.8
) -> float:
    """Tokens the Z statistic needs to detect a mean excess of `excess` nats per token at combined p <
    `alpha` (Bonferroni over STATISTICS) with probability `power`, given the measured variance per token:
    n excess / sqrt(n var) must reach z_{1 - alpha / 2k} + z_power."""
    from scipy import stats  # imported here: see the module's note on scipy

    if not np.isfinite(var_per_token) or var_per_token <= 0:
        return float("nan")
    z = stats.norm.isf(alpha / (2 * len(STATISTICS))) + stats.norm.isf(1 - power)
    return float(var_per_token * (z / excess) ** 2)


def tokens_for_split_power(
    var_per_token: float, excess: float = POWER_EXCESS, alpha: float = ALPHA, power: float = 0.8
) -> float:
    """Tokens a strata statistic needs to detect an excess of +`excess` nats a token in some of its classes and
    -`excess` in the others (a departure whose mean over all tokens can be 0, so Z cannot see it) at combined
    p < `alpha` with probability `power`: sum_k Z_k^2 is then chi-square with N_STRATA degrees of freedom and
    noncentrality n excess^2 / var."""
    from scipy import optimize, stats  # imported here: see the module's note on scipy

    if not np.isfinite(var_per_token) or var_per_token <= 0:
        return float("nan")
    critical = stats.chi2.isf(alpha / len(STATISTICS), N_STRATA)
    noncentrality = optimize.brentq(lambda nc: stats.ncx2.sf(critical, N_STRATA, nc) - power, 1e-9, 1e6)
    return float(var_per_token * noncentrality / excess**2)


def strata_test(d: np.ndarray, var: np.ndarray, ok: np.ndarray, label: np.ndarray) -> float:
    """p of sum_k Z_k^2 against chi-square(K), Z_k the surprisal-excess Z of the tested positions of class k
    (`label`, broadcast to d's shape; -1 = no class): Z_k are close to independent N(0, 1) for an exact
    sampler, and an excess of opposite signs in two classes moves both away from 0."""
    from scipy import stats  # imported here: see the module's note on scipy

    classes = [k for k in np.unique(label[ok]) if k >= 0 and var[ok & (label == k)].sum() > 0]
    if not classes:
        return float("nan")
    z2 = sum(d[ok & (label == k)].sum() ** 2 / var[ok & (label == k)].sum() for k in classes)
    return float(stats.chi2.sf(z2, len(classes)))


def entropy_classes(entropy: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """The entropy quartile of each position, cut at the quartiles of the tested positions' entropies."""
    cuts = np.quantile(entropy[ok], np.linspace(0, 1, N_STRATA + 1)[1:-1]) if ok.any() else []
    return np.searchsorted(cuts, entropy, side="right")


def position_classes(grid: CodeGrid) -> np.ndarray:
    """The band of image rows of each position (N_STRATA bands, top to bottom; -1 off the image)."""
    n_rows = int(grid.row.max()) + 1 if (grid.row >= 0).any() else 1
    return np.where(grid.row >= 0, grid.row * min(N_STRATA, n_rows) // n_rows, -1)


def _row_ks(u: np.ndarray, ok: np.ndarray, row: np.ndarray) -> float:
    """Per code row, a KS test of that row's U (pooled over images) against uniform; Bonferroni over rows."""
    from scipy import stats  # imported here: see the module's note on scipy

    rows = [r for r in np.unique(row[row >= 0]) if ok[:, row == r].any()]
    ps = [stats.kstest(u[:, row == r][ok[:, row == r]], "uniform").pvalue for r in rows]
    return float(min(1.0, min(ps) * len(ps))) if ps else float("nan")


def exactness_statistics(terms: TokenTerms, uniforms: np.ndarray, grid: CodeGrid) -> dict:
    """The one-sample audit's numbers for one decoder's images (columns prefixed tf_, docs/algorithms.md).

    tf_p combines the p-values of STATISTICS by Bonferroni and is 0 when a committed token has
    probability 0 (impossible for an exact sampler); NaN when nothing was testable. A token at p = 0 that ties
    the top-k cutoff (TokenTerms.tie) is neither impossible nor tested: tf_cutoff_ties counts them."""
    from scipy import stats  # imported here: see the module's note on scipy

    var = np.clip(terms.second - terms.entropy**2, 0.0, None)
    tie = terms.ties()
    # at a free position: outside top-k / top-p or the codes; at a forced one: off-grammar
    zero = (terms.p_token <= 0) & ~tie
    ok = grid.tested[None] & ~zero & ~tie & (var > 1e-12)
    n = int(ok.sum())
    d = -np.log(np.where(ok, terms.p_token, 1.0)) - terms.entropy
    out = {"tf_n_images": int(len(uniforms)), "tf_n_tokens": n, "tf_zero_count": int(zero.sum()),
           "tf_zero_share": float(zero.sum() / max(1, (grid.tested[None] | zero).sum())),
           "tf_cutoff_ties": int(tie.sum())}  # fmt: skip
    if n == 0:
        nan = float("nan")
        return {**out, "tf_z": nan, "tf_excess_nats": nan, "tf_var_nats2": nan, "tf_ks_d": nan, "tf_ks_p": nan,
                "tf_row_ks_p": nan, "tf_lag1_r": nan, "tf_lag1_p": nan, "tf_lag_row_r": nan, "tf_lag_row_p": nan,
                "tf_entropy_strata_p": nan, "tf_position_strata_p": nan, "tf_tokens_needed": nan,
                "tf_tokens_needed_split": nan, "tf_p": 0.0 if out["tf_zero_count"] else nan}  # fmt: skip
    z = float(d[ok].sum() / np.sqrt(var[ok].sum()))
    ks = stats.kstest(uniforms[ok], "uniform")
    g = stats.norm.ppf(np.clip(uniforms, 1e-300, 1 - 1e-16))
    lag1_r, lag1_p, _ = _lag_correlation(g, ok, 1)
    row_r, row_p, _ = _lag_correlation(g, ok, grid.row_stride)
    by_entropy, by_band = entropy_classes(terms.entropy, ok), np.broadcast_to(position_classes(grid), d.shape)
    ps = {"z": float(2 * stats.norm.sf(abs(z))), "ks": float(ks.pvalue), "row_ks": _row_ks(uniforms, ok, grid.row),
          "lag1": lag1_p, "lag_row": row_p, "entropy_strata": strata_test(d, var, ok, by_entropy),
          "position_strata": strata_test(d, var, ok, by_band)}  # fmt: skip
    finite = [p for p in ps.values() if np.isfinite(p)]
    combined = 0.0 if out["tf_zero_count"] else float(min(1.0, min(finite) * len(finite)))
    var_per_token = float(var[ok].mean())
    return {**out, "tf_z": z, "tf_excess_nats": float(d[ok].mean()), "tf_var_nats2": var_per_token,
            "tf_ks_d": float(ks.statistic), "tf_ks_p": ps["ks"], "tf_row_ks_p": ps["row_ks"], "tf_lag1_r": lag1_r,
            "tf_lag1_p": lag1_p, "tf_lag_row_r": row_r, "tf_lag_row_p": row_p,
            "tf_entropy_strata_p": ps["entropy_strata"], "tf_position_strata_p": ps["position_strata"],
            "tf_tokens_needed": tokens_for_power(var_per_token),
            "tf_tokens_needed_split": tokens_for_split_power(var_per_token), "tf_p": combined}  # fmt: skip


def impossible_share(zero: np.ndarray, counted: np.ndarray) -> float:
    """The share of `counted` positions whose committed token has probability 0; NaN when none is counted."""
    n = int(counted.sum())
    return float(zero[counted].sum() / n) if n else float("nan")


BLOCK_ROW_COLUMNS = ["tf_zero_share_top_row", "tf_zero_share_rows_below"]


def zero_share_by_block_row(terms: TokenTerms, grid: CodeGrid, block_depth: np.ndarray | None) -> dict:
    """tf_zero_share split by the row of its block that committed each token (`block_depth` [n_images, n_tokens],
    a decoder's record of it, sjd.decoders.ssd: 0 the block's top row, 1, 2, ... the rows below, -1 no block). A
    lower row is drafted and kept on part of the rows above only, so where the impossible tokens fall says which
    of the two departures makes them. NaN for both without the record (a decoder with no blocks), NaN for a class
    with no position."""
    if block_depth is None:
        return dict.fromkeys(BLOCK_ROW_COLUMNS, float("nan"))
    zero = (terms.p_token <= 0) & ~terms.ties()
    counted = grid.tested[None] | zero  # as tf_zero_share counts
    return {
        "tf_zero_share_top_row": impossible_share(zero, counted & (block_depth == 0)),
        "tf_zero_share_rows_below": impossible_share(zero, counted & (block_depth >= 1)),
    }


TF_COLUMNS = [
    "tf_n_images", "tf_n_tokens", "tf_z", "tf_excess_nats", "tf_var_nats2", "tf_ks_d", "tf_ks_p", "tf_row_ks_p",
    "tf_lag1_r", "tf_lag1_p", "tf_lag_row_r", "tf_lag_row_p", "tf_entropy_strata_p", "tf_position_strata_p",
    "tf_zero_count", "tf_zero_share", "tf_cutoff_ties", *BLOCK_ROW_COLUMNS, "tf_tokens_needed",
    "tf_tokens_needed_split", "tf_p",
]  # fmt: skip


def audit_images(
    adapter: ModelAdapter,
    prompts: Sequence[Prompt],
    tokens: torch.Tensor,
    seeds: Sequence[int],
    sampling: SamplingConfig,
    batch_size: int,
    block_depth: np.ndarray | None = None,
) -> dict:
    """The one-sample audit of images `tokens` [n, N] drawn for `prompts` with generator seeds `seeds`, with the
    impossible tokens split by block row where the decoder recorded `block_depth` [n, N]."""
    terms = teacher_forced_tokens(adapter, prompts, tokens, sampling, batch_size)
    grid = code_grid(adapter.layout)
    return {**exactness_statistics(terms, pit_uniforms(terms, seeds), grid),
            **zero_share_by_block_row(terms, grid, block_depth)}  # fmt: skip
