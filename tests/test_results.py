"""sjd.harness.results.summarize: the in-run forward cost and efficiency that keep decoder bookkeeping visible."""

import math

import pandas as pd
import pytest

from sjd.harness.results import summarize


def samples(decoder: str, n_forward: int, latency_s: float, model_s: float, n: int = 2) -> list[dict]:
    accepted = [10 // n_forward] * n_forward
    return [
        {"decoder": decoder, "prompt_id": str(i), "n_tokens": 10, "n_forward": n_forward, "latency_s": latency_s,
         "prefill_s": 0.01, "decode_s": latency_s - 0.01, "model_s": model_s, "accepted": accepted,
         "peak_mem_mb": 1.0, "peak_mem_kind": "process_rss"}
        for i in range(n)
    ]  # fmt: skip


def test_efficiency_is_speedup_over_what_model_time_allows():
    # AR: 10 one-token forwards, 0.9 s of its 1.0 s in the model. The decoder: 2 forwards of 0.15 s
    # (each costs 1.67 one-token forwards), 0.3 s of its 0.5 s in the model.
    table = pd.DataFrame(samples("ar", 10, 1.0, 0.9) + samples("sjd", 2, 0.5, 0.3))
    rows = summarize(table, "ar", {"model": "toy"}).set_index("decoder")
    assert rows.loc["sjd", "step_compression"] == 5.0 and rows.loc["sjd", "latency_speedup"] == pytest.approx(2.0)
    assert rows.loc["sjd", "forward_cost"] == pytest.approx(0.15 / 0.09)
    # At best 5 / 1.67 = 3x faster; it is 2x faster: two thirds, = its model-time share over AR's.
    assert rows.loc["sjd", "efficiency"] == pytest.approx(2 / 3)
    assert rows.loc["sjd", "efficiency"] == pytest.approx((0.3 / 0.5) / (0.9 / 1.0))
    assert rows.loc["ar", "forward_cost"] == 1.0 and rows.loc["ar", "efficiency"] == 1.0


def test_slower_bookkeeping_lowers_efficiency_not_forward_cost():
    lean = summarize(pd.DataFrame(samples("ar", 10, 1.0, 0.9) + samples("x", 2, 0.4, 0.3)), "ar", {"model": "toy"})
    heavy = summarize(pd.DataFrame(samples("ar", 10, 1.0, 0.9) + samples("x", 2, 0.8, 0.3)), "ar", {"model": "toy"})
    lean, heavy = lean.set_index("decoder").loc["x"], heavy.set_index("decoder").loc["x"]
    assert lean.forward_cost == pytest.approx(heavy.forward_cost)
    assert heavy.efficiency == pytest.approx(lean.efficiency / 2)


def test_without_a_baseline_there_is_nothing_to_compare():
    rows = summarize(pd.DataFrame(samples("sjd", 2, 0.5, 0.3)), None, {"model": "toy"})
    assert math.isnan(rows.loc[0, "efficiency"]) and math.isnan(rows.loc[0, "forward_cost"])
