"""Error bars for a run's summary rows, from its per-sample lines (samples.jsonl).

The unit is the prompt: a prompt's seeds (seeds_per_prompt) are summed into one unit first, so
samples of one prompt, which share its caption, are never treated as independent. Then:

- forwards per image and latency: the mean over units and its standard error, the units' sample
  standard deviation over sqrt(n) (`mean_se`);
- step compression (tokens / forwards, a ratio of sums): the standard error of a ratio estimator
  by the delta method (`ratio_se`), and a 95% percentile bootstrap interval over the units;
- every ratio between two decoders of the same run (latency speedup and efficiency over the baseline, step
  compression over a reference SJD, fe_compression and the modelled speedup over the baseline, and priced forwards
  and modelled time over a reference: `fe_vs_<ref>`, `modelled_vs_<ref>`): a 95% percentile interval from a paired
  bootstrap over the prompts both decoders decoded. One resample draws n of the n shared prompts with replacement
  and recomputes the ratio from both decoders' values on those same prompts, so the prompt-to-prompt variation both
  share cancels. BOOTSTRAP_RESAMPLES resamples from numpy.random.default_rng(BOOTSTRAP_SEED): the interval is the
  same every time the summary is made.

Latency is different: a batch is timed as a whole, and each of its samples carries the batch's time. So the
latency speedup's and the efficiency's unit is the *timed batch* (`batch_units`): one latency and one model
time per batch, paired with the baseline's batch of the same samples. `latency_units` counts the paired
batches; a run of one timed batch has no latency interval (NaN), and a run with batch_size 1 has one unit a
sample, as before.

Fewer than two units give NaN: one prompt says nothing about the spread over prompts, one timed batch
nothing about the spread of timings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

BOOTSTRAP_SEED = 0
BOOTSTRAP_RESAMPLES = 2000
LEVEL = 0.95
# Decoders a run's step compression is also compared with, where the run has them (the pages' "vs sjd"
# columns, the regime map's vs_official_sjd / vs_harness_sjd, and the goal page's SJD-PAC and SCD at window 64).
REFERENCES = ("sjd", "sjd_official", "sjd_official_forced", "sjd_harness", "sjd_pac_official_w64", "scd_official_w64")
UNIT_COLUMNS = ("n_tokens", "n_forward", "latency_s", "model_s", "priced_forwards", "modelled_s", "modelled_eager_s")
# What every sample of one timed batch shares, and no two batches do: the batch's own clocks and its size.
BATCH_CLOCKS = ("latency_s", "prefill_s", "decode_s", "model_s", "batch_size")

# A statistic of per-unit arrays: each array has the units on its last axis (1-D for the estimate,
# (resamples, units) under the bootstrap) and the statistic reduces that axis.
Statistic = Callable[..., np.ndarray]


def mean_se(values: Sequence[float] | np.ndarray) -> float:
    """Standard error of the mean: sample standard deviation (ddof 1) over sqrt(n); NaN for n < 2."""
    x = np.asarray(values, dtype=float)
    return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) >= 2 else float("nan")


def ratio_se(top: Sequence[float] | np.ndarray, bottom: Sequence[float] | np.ndarray) -> float:
    """Delta-method standard error of sum(top) / sum(bottom) over units: the standard error of the
    mean of the residuals top - R * bottom, over mean(bottom). NaN for n < 2."""
    t, b = np.asarray(top, dtype=float), np.asarray(bottom, dtype=float)
    if len(t) < 2:
        return float("nan")
    return mean_se(t - t.sum() / b.sum() * b) / float(b.mean())


def bootstrap_interval(
    statistic: Statistic,
    columns: Sequence[np.ndarray],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = LEVEL,
) -> tuple[float, float]:
    """Percentile interval of `statistic(*columns)` when the units (shared by every column, so the
    resampling is paired) are drawn with replacement. (NaN, NaN) for fewer than two units."""
    arrays = [np.asarray(c, dtype=float) for c in columns]
    n = len(arrays[0])
    if n < 2:
        return float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    values = statistic(*(a[picks] for a in arrays))
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def compression(tokens: np.ndarray, forwards: np.ndarray) -> np.ndarray:
    return tokens.sum(-1) / forwards.sum(-1)


def compression_ratio(
    tokens: np.ndarray, forwards: np.ndarray, ref_tokens: np.ndarray, ref_forwards: np.ndarray
) -> np.ndarray:
    return compression(tokens, forwards) / compression(ref_tokens, ref_forwards)


def latency_ratio(base_latency: np.ndarray, latency: np.ndarray) -> np.ndarray:
    return base_latency.sum(-1) / latency.sum(-1)


def efficiency_ratio(
    base_latency: np.ndarray, latency: np.ndarray, base_model_s: np.ndarray, model_s: np.ndarray
) -> np.ndarray:
    """latency speedup over the speedup the model time allows (sjd.harness.results.forward_efficiency)."""
    return latency_ratio(base_latency, latency) * model_s.sum(-1) / base_model_s.sum(-1)


def prompt_units(samples: pd.DataFrame) -> pd.DataFrame:
    """Per (decoder, prompt): the sums over its seeds of tokens, forwards, latency and model time."""
    present = [c for c in UNIT_COLUMNS if c in samples]
    ids = samples["prompt_id"] if "prompt_id" in samples else pd.Series(range(len(samples)), index=samples.index)
    by_prompt = samples.groupby([samples["decoder"], ids.rename("prompt_id")], sort=False)  # no ids: a row a unit
    return by_prompt[present].sum(min_count=1).assign(n_seeds=by_prompt.size())  # NaN stays NaN


def batch_units(samples: pd.DataFrame) -> pd.DataFrame:
    """Per (decoder, timed batch): the batch's latency and model time, indexed by the batch's samples (their
    sorted prompt ids and seed indices), so that a decoder's batch pairs with the baseline's batch of the same
    samples. A batch is the samples of one decoder with the same `timed_batch`, or, on lines written before
    that was recorded, the samples of one decoder that share every clock in BATCH_CLOCKS."""
    recorded = "timed_batch" in samples and samples["timed_batch"].fillna("").astype(bool).all()
    clocks = ["timed_batch"] if recorded else [c for c in BATCH_CLOCKS if c in samples]
    ids = samples["prompt_id"] if "prompt_id" in samples else pd.Series(samples.index.astype(str), samples.index)
    seeds = samples["seed_index"] if "seed_index" in samples else 0
    member = ids.astype(str) + "#" + pd.Series(seeds, index=samples.index).astype(str)
    rows = []
    for (decoder, *_), batch in samples.assign(member=member).groupby(["decoder", *clocks], sort=False):
        first = batch.iloc[0]
        rows.append({"decoder": decoder, "batch": " ".join(sorted(batch["member"])),
                     "latency_s": float(first["latency_s"]),
                     "model_s": float(first["model_s"]) if "model_s" in batch else np.nan})  # fmt: skip
    return pd.DataFrame(rows, columns=["decoder", "batch", "latency_s", "model_s"]).set_index(["decoder", "batch"])


def paired(units: pd.DataFrame, decoder: str, other: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both decoders' units on the prompts both decoded, in the same order."""
    mine, theirs = units.loc[decoder], units.loc[other]
    shared = mine.index.intersection(theirs.index)
    return mine.loc[shared], theirs.loc[shared]


def own_intervals(units: pd.DataFrame) -> dict[str, float]:
    """One decoder's: SE of forwards per image, and step compression's SE and interval."""
    per_image = units[["n_forward"]].div(units["n_seeds"], axis=0)
    lo, hi = bootstrap_interval(compression, [units["n_tokens"], units["n_forward"]])
    return {
        "n_forward_se": mean_se(per_image["n_forward"]),
        "step_compression_se": ratio_se(units["n_tokens"], units["n_forward"]),
        "step_compression_lo": lo,
        "step_compression_hi": hi,
    }


def baseline_intervals(mine: pd.DataFrame, base: pd.DataFrame) -> dict[str, float]:
    """Paired intervals of latency speedup and efficiency over the baseline, over timed batches (batch_units)
    of the same samples; `latency_units` is how many."""
    speedup = bootstrap_interval(latency_ratio, [base["latency_s"], mine["latency_s"]])
    out = {"latency_units": len(mine), "latency_speedup_lo": speedup[0], "latency_speedup_hi": speedup[1]}
    if mine["model_s"].notna().all() and base["model_s"].notna().all():
        columns = [base["latency_s"], mine["latency_s"], base["model_s"], mine["model_s"]]
        out["efficiency_lo"], out["efficiency_hi"] = bootstrap_interval(efficiency_ratio, columns)
    return out


def modelled_efficiency(
    base_s: np.ndarray, mine_s: np.ndarray, base_forwards: np.ndarray, forwards: np.ndarray
) -> np.ndarray:
    """The modelled speedup over the step compression: the baseline's modelled time per forward over the
    decoder's."""
    return latency_ratio(base_s, mine_s) * forwards.sum(-1) / base_forwards.sum(-1)


def unpriced_forwards(mine: pd.DataFrame) -> pd.Series | None:
    """On a model with no GPU price, the forwards a decoder without a drafter or heads pays: its own target
    forwards (fe_compression is then its step compression); None for one that drafts with a network."""
    drafts = [c for c in ("drafter_forwards", "head_forwards") if c in mine]
    if any(mine[c].fillna(0).ne(0).any() for c in drafts):
        return None
    return mine["n_forward"]


def priced_intervals(mine: pd.DataFrame, base: pd.DataFrame) -> dict[str, float]:
    """Paired intervals over prompts of what a GPU would pay (sjd.harness.pricing): fe_compression (the
    baseline's forwards over the decoder's priced forwards), and the modelled speedup and efficiency of each
    modelled engine."""
    out = {}
    priced = unpriced_forwards(mine)
    if "priced_forwards" in mine and mine["priced_forwards"].notna().all():
        priced = mine["priced_forwards"]
    if priced is not None:
        out["fe_compression_lo"], out["fe_compression_hi"] = bootstrap_interval(
            latency_ratio, [base["n_forward"], priced])  # fmt: skip
    for engine in ("", "eager_"):
        column = f"modelled_{engine}s"
        if column not in mine or mine[column].isna().any() or base[column].isna().any():
            continue
        lo_hi = bootstrap_interval(latency_ratio, [base[column], mine[column]])
        out[f"modelled_{engine}speedup_lo"], out[f"modelled_{engine}speedup_hi"] = lo_hi
        columns = [base[column], mine[column], base["n_forward"], mine["n_forward"]]
        lo_hi = bootstrap_interval(modelled_efficiency, columns)
        out[f"modelled_{engine}efficiency_lo"], out[f"modelled_{engine}efficiency_hi"] = lo_hi
    return out


def reference_intervals(mine: pd.DataFrame, ref: pd.DataFrame, name: str) -> dict[str, float]:
    """Step compression over the reference decoder `name`: the ratio and its paired interval."""
    columns = [mine["n_tokens"], mine["n_forward"], ref["n_tokens"], ref["n_forward"]]
    lo, hi = bootstrap_interval(compression_ratio, columns)
    ratio = float(compression_ratio(*(np.asarray(c, dtype=float) for c in columns)))
    out = {f"vs_{name}": ratio, f"vs_{name}_lo": lo, f"vs_{name}_hi": hi}
    # What a GPU would pay, over the reference: its priced forwards over ours, and its modelled time over ours.
    for prefix, column in (("fe", "priced_forwards"), ("modelled", "modelled_s")):
        if column in mine and mine[column].notna().all() and ref[column].notna().all():
            pair = [np.asarray(ref[column], dtype=float), np.asarray(mine[column], dtype=float)]
            lo, hi = bootstrap_interval(latency_ratio, pair)
            out |= {f"{prefix}_vs_{name}": float(latency_ratio(*pair)), f"{prefix}_vs_{name}_lo": lo,
                    f"{prefix}_vs_{name}_hi": hi}  # fmt: skip
    return out


def summary_intervals(samples: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """One row per decoder (column `decoder`) of every interval above. A decoder's ratios to itself
    (the baseline's speedup, a reference's own step compression over itself) are left NaN."""
    units, batches = prompt_units(samples), batch_units(samples)
    decoders = list(dict.fromkeys(samples["decoder"]))
    rows = []
    for decoder in decoders:
        row = {"decoder": decoder, **own_intervals(units.loc[decoder])}
        row["latency_s_se"] = mean_se(batches.loc[decoder, "latency_s"])  # over timed batches
        if baseline in decoders and decoder != baseline:
            row |= baseline_intervals(*paired(batches, decoder, baseline))
            row |= priced_intervals(*paired(units, decoder, baseline))
        for ref in (r for r in REFERENCES if r in decoders and r != decoder):
            row |= reference_intervals(*paired(units, decoder, ref), ref)
        rows.append(row)
    return pd.DataFrame(rows)


def excludes_one(lo: float, hi: float) -> bool | None:
    """Whether the interval lies wholly above or below 1; None when there is no interval."""
    if lo is None or hi is None or np.isnan(lo) or np.isnan(hi):
        return None
    return bool(lo > 1 or hi < 1)
