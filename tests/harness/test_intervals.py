"""sjd.harness.intervals: error bars of summary rows against synthetic samples whose answer is known."""

import math

import numpy as np
import pandas as pd
import pytest

from sjd.harness import intervals
from sjd.harness.results import summary_rows
from studies.regime import ratio_interval


def rows(decoder: str, forwards: list[float], latencies: list[float], seeds: int = 1) -> list[dict]:
    return [
        {"decoder": decoder, "prompt_id": str(i), "seed_index": k, "n_tokens": 120, "n_forward": f, "latency_s": t,
         "prefill_s": 0.0, "decode_s": t, "model_s": t / 2, "accepted": [1], "peak_mem_mb": 1.0,
         "peak_mem_kind": "process_rss"}
        for i, (f, t) in enumerate(zip(forwards, latencies)) for k in range(seeds)
    ]  # fmt: skip


def test_the_standard_error_of_a_normal_sample_is_sigma_over_root_n():
    x = np.random.default_rng(1).normal(5.0, 2.0, size=40_000)
    assert intervals.mean_se(x) == pytest.approx(2.0 / 200, rel=0.02)
    assert intervals.mean_se([1.0, 3.0]) == pytest.approx(1.0)  # std (ddof 1) sqrt(2), over sqrt(2)
    assert math.isnan(intervals.mean_se([4.0]))


def test_the_ratio_standard_error_matches_the_spread_of_resampled_ratios():
    rng = np.random.default_rng(2)
    forwards = rng.uniform(20, 60, size=400)
    tokens = np.full(400, 120.0)
    se = intervals.ratio_se(tokens, forwards)
    picks = rng.integers(0, 400, size=(4000, 400))
    spread = (tokens[picks].sum(1) / forwards[picks].sum(1)).std()
    assert se == pytest.approx(spread, rel=0.1)
    assert intervals.ratio_se(tokens, np.full(400, 30.0)) == 0.0  # constant ratio: no spread


def test_constant_per_prompt_ratios_give_a_zero_width_interval_at_that_ratio():
    base = [1.0, 2.0, 5.0, 3.0, 0.5]
    table = pd.DataFrame(rows("ar", [120] * 5, base) + rows("sjd", [40, 30, 24, 60, 40], [t / 4 for t in base]))
    sjd = summary_rows(table, "ar", {"model": "toy"}).set_index("decoder").loc["sjd"]
    assert sjd["latency_speedup"] == pytest.approx(4.0)
    assert (sjd["latency_speedup_lo"], sjd["latency_speedup_hi"]) == (pytest.approx(4.0), pytest.approx(4.0))
    assert sjd["efficiency_lo"] == pytest.approx(sjd["efficiency"]) == pytest.approx(sjd["efficiency_hi"])
    assert sjd["step_compression_lo"] < sjd["step_compression"] < sjd["step_compression_hi"]  # forwards vary


def test_a_paired_bootstrap_recovers_a_known_ratio_that_unpaired_noise_would_hide():
    rng = np.random.default_rng(3)
    base = rng.lognormal(0.0, 1.0, size=32)  # prompts differ tenfold: only pairing removes that spread
    mine = base / 2.5 * rng.normal(1.0, 0.03, size=32)
    lo, hi = intervals.bootstrap_interval(intervals.latency_ratio, [base, mine])
    assert lo < 2.5 < hi and hi - lo < 0.1
    unpaired = intervals.bootstrap_interval(lambda a, b: a.sum(-1) / b.sum(-1), [base, rng.permutation(mine)])
    assert unpaired[1] - unpaired[0] > 5 * (hi - lo)
    assert intervals.bootstrap_interval(intervals.latency_ratio, [base, mine]) == (lo, hi)  # fixed seed


def test_step_compression_over_sjd_is_paired_and_seeds_are_summed_per_prompt():
    forwards = [40.0, 30.0, 20.0, 60.0]
    table = pd.DataFrame(
        rows("ar", [120] * 4, [1.0] * 4, seeds=2) + rows("sjd", forwards, [0.5] * 4, seeds=2)
        + rows("fast", [f / 1.5 for f in forwards], [0.4] * 4, seeds=2)
    )  # fmt: skip
    units = intervals.prompt_units(table)
    assert units.loc[("sjd", "0"), "n_forward"] == 80.0 and units.loc[("sjd", "0"), "n_seeds"] == 2
    summary = summary_rows(table, "ar", {"model": "toy"}).set_index("decoder")
    fast = summary.loc["fast"]
    assert fast["vs_sjd"] == pytest.approx(1.5)
    assert fast["vs_sjd_lo"] == pytest.approx(1.5) and fast["vs_sjd_hi"] == pytest.approx(1.5)
    assert summary.loc["sjd", "n_forward_se"] == pytest.approx(intervals.mean_se(forwards))
    assert math.isnan(summary.loc["sjd", "vs_sjd_lo"]) and math.isnan(summary.loc["ar", "latency_speedup_lo"])


def test_one_prompt_has_no_interval_and_an_interval_says_whether_it_excludes_one():
    table = pd.DataFrame(rows("ar", [120], [1.0]) + rows("sjd", [40], [0.5]))
    sjd = summary_rows(table, "ar", {"model": "toy"}).set_index("decoder").loc["sjd"]
    assert math.isnan(sjd["latency_speedup_lo"]) and math.isnan(sjd["n_forward_se"])
    assert intervals.excludes_one(1.1, 1.4) and intervals.excludes_one(0.5, 0.9)
    assert intervals.excludes_one(0.9, 1.2) is False and intervals.excludes_one(float("nan"), 2.0) is None


def test_a_ratio_of_two_runs_adds_their_relative_variances():
    lo, hi = ratio_interval(2.0, [0.03, 0.04])  # relative SE 0.05 of the ratio
    assert (lo, hi) == (pytest.approx(2.0 - 1.959964 * 0.1), pytest.approx(2.0 + 1.959964 * 0.1))
    assert all(math.isnan(v) for v in ratio_interval(2.0, [0.03, float("nan")]))


def batched(decoder: str, latencies: list[float], size: int, recorded: bool = True) -> list[dict]:
    """Samples of `len(latencies)` timed batches of `size` prompts each; every sample carries its batch's time."""
    out = []
    for b, t in enumerate(latencies):
        for r in range(size):
            i = b * size + r
            out.append({"decoder": decoder, "prompt_id": str(i), "seed_index": 0, "n_tokens": 120, "n_forward": 40,
                        "latency_s": t, "prefill_s": 0.0, "decode_s": t, "model_s": t / 2, "batch_size": size,
                        "accepted": [1], "peak_mem_mb": 1.0, "peak_mem_kind": "process_rss"})  # fmt: skip
            if recorded:
                out[-1]["timed_batch"] = f"{b * size}#0"
    return out


def test_latency_intervals_resample_timed_batches_not_the_prompts_in_them():
    """Four batches of eight prompts: four timing units, paired with AR's batch of the same prompts. Resampling the
    32 prompts, each carrying its batch's time, would make the interval about sqrt(8) times too narrow."""
    base, mine = [4.0, 6.0, 5.0, 8.0], [2.0, 2.0, 2.5, 2.0]
    table = pd.DataFrame(batched("ar", base, 8) + batched("sjd", mine, 8))
    units = intervals.batch_units(table)
    assert len(units.loc["sjd"]) == 4 and list(units.loc["sjd", "latency_s"]) == mine
    sjd = summary_rows(table, "ar", {"model": "toy"}).set_index("decoder").loc["sjd"]
    assert sjd["latency_units"] == 4
    expected = intervals.bootstrap_interval(intervals.latency_ratio, [np.array(base), np.array(mine)])
    assert (sjd["latency_speedup_lo"], sjd["latency_speedup_hi"]) == pytest.approx(expected)
    assert sjd["latency_s_se"] == pytest.approx(intervals.mean_se(mine))
    per_prompt = intervals.bootstrap_interval(intervals.latency_ratio, [np.repeat(base, 8), np.repeat(mine, 8)])
    assert per_prompt[1] - per_prompt[0] < 0.6 * (expected[1] - expected[0])  # what counting prompts would claim


def test_one_timed_batch_has_no_latency_interval_and_old_lines_are_grouped_by_their_clocks():
    one = summary_rows(pd.DataFrame(batched("ar", [4.0], 8) + batched("sjd", [2.0], 8)), "ar", {"model": "toy"})
    sjd = one.set_index("decoder").loc["sjd"]
    assert sjd["latency_units"] == 1 and math.isnan(sjd["latency_speedup_lo"]) and math.isnan(sjd["efficiency_lo"])
    assert not math.isnan(sjd["step_compression"]) and sjd["n_captions"] == 8
    old = pd.DataFrame(batched("ar", [4.0, 6.0, 5.0], 2, recorded=False) + batched("sjd", [2.0, 2.1, 2.5], 2, False))
    assert len(intervals.batch_units(old).loc["sjd"]) == 3


def test_pages_say_which_latency_intervals_are_missing_and_why():
    from studies.tables import NO_INTERVAL, ONE_BATCH, ONE_PROMPT, interval_cells

    rows = pd.DataFrame({"decoder": ["a", "b", "c"], "latency_speedup": [2.0, 2.0, 2.0],
                         "latency_speedup_lo": [1.5, np.nan, 2.0], "latency_speedup_hi": [2.5, np.nan, 2.0],
                         "latency_units": [4, 1, np.nan], "n_captions": [32, 8, 8]})  # fmt: skip
    cells = interval_cells(rows, "latency_speedup", "latency_speedup_lo", "latency_speedup_hi", ".2f", None)
    assert cells == ["2.00 (1.50-2.50)", f"2.00 ({ONE_BATCH})", f"2.00 ({NO_INTERVAL})"]  # c: over prompts, old
    alone = rows.assign(batch_size=[8, 8, 1])  # an old row whose prompts were timed one at a time keeps its interval
    cells = interval_cells(alone, "latency_speedup", "latency_speedup_lo", "latency_speedup_hi", ".2f", None)
    assert cells[2] == "2.00 (2.00-2.00)"
    steps = rows.rename(columns=lambda c: c.replace("latency_speedup", "step_compression"))
    steps["n_captions"] = [32, 1, 8]
    cells = interval_cells(steps, "step_compression", "step_compression_lo", "step_compression_hi", ".2f", None)
    assert cells == ["2.00 (1.50-2.50)", f"2.00 ({ONE_PROMPT})", "2.00 (2.00-2.00)"]  # prompts are its units
