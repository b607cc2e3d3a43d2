"""studies.latency_verdict: a latency target is met only over the cost model's whole range (or on measured time),
reads "depends on the engine" where engines disagree, and every verdict says what decided it."""

import json

import numpy as np
import pandas as pd

from sjd.harness.model_range import ModelledRange
from studies.latency_verdict import MEASURED, MODELLED, judge, modelled_verdict, verdict


def summary_row(decoder: str, forwards: float, width: float = 16, spread: float = 0.02) -> dict:
    """A run's summary row with the counts the cost model prices (its class counted by no sync count)."""
    return {"decoder": decoder, "baseline": "ar", "n_forward": forwards, "priced_context": 1000.0,
            "priced_width": width, "decoder_ops_per_iter": 100.0, "syncs_per_iter": 1.0, "prices_as": "chameleon_7b",
            "sampling": json.dumps({"cfg_scale": 3.0}), "decoder_classes": json.dumps({decoder: "TestDecoder"}),
            "decoder_configs": json.dumps({decoder: {"window": int(width)}}), "compiled": False,
            "drafter_forwards": np.nan, "modelled_speedup": 1.0, "modelled_speedup_lo": 1.0 - spread,
            "modelled_speedup_hi": 1.0 + spread}  # fmt: skip


def engines(eager, compiled, graphed) -> ModelledRange:
    ranges = {"eager": eager, "compiled": compiled, "graphed": graphed}
    lo, hi = min(v[1] for v in ranges.values()), max(v[2] for v in ranges.values())
    return ModelledRange(graphed[0], lo, hi, ranges, {}, True)


def test_a_ratio_that_holds_on_graphed_but_not_on_eager_depends_on_the_engine():
    modelled = engines((1.10, 1.05, 1.15), (1.12, 1.06, 1.18), (1.35, 1.29, 1.41))
    assert modelled_verdict(modelled, 1.25) == "depends on the engine (met on graphed; missed on eager and compiled)"
    assert modelled_verdict(modelled, 1.0).startswith("met over the model's whole range")
    assert modelled_verdict(modelled, 1.5).startswith("missed over the model's whole range")
    crossing = engines((1.2, 1.1, 1.3), (1.2, 1.1, 1.3), (1.3, 1.2, 1.4))
    assert modelled_verdict(crossing, 1.25).startswith("not distinguishable")


def test_rows_whose_engines_disagree_read_depends_on_the_engine_and_say_the_model_decided():
    """A window of 16 taking 1.3x the forwards of a window of 256: graphed, the wide forwards' FLOPs make the
    narrow decoder 1.5x faster over the whole range; eager, their host calls hide that, and it is not."""
    rows = [summary_row("ar", 1000.0, 1), summary_row("narrow", 130.0, 16), summary_row("wide", 100.0, 256)]
    rows = pd.DataFrame(rows)
    judged = judge(rows, rows.iloc[1], ["wide"])
    assert judged.by == MODELLED and judged.modelled is not None
    text = verdict(judged, 1.5)
    assert text.startswith("depends on the engine (met on graphed") and "missed on eager" in text
    assert text.endswith("decided by the cost model over its range")


def test_measured_rows_decide_on_their_measured_latency():
    """Rows timed on the real architecture (a `shadow` column) are decided on measured time, not on the model."""
    rows = pd.DataFrame([summary_row("ar", 1000.0, 1), summary_row("a", 50.0), summary_row("b", 100.0)])
    rows = rows.assign(shadow="chameleon_7b", latency_s=[10.0, 1.0, 1.5], latency_speedup=[1.0, 10.0, 6.67],
                       latency_speedup_lo=[np.nan, 9.5, 6.5], latency_speedup_hi=[np.nan, 10.5, 6.8])  # fmt: skip
    judged = judge(rows, rows.iloc[1], ["b"])
    assert judged.by == MEASURED and judged.point == 1.5
    assert judged.lo == 9.5 / 6.8 and judged.hi == 10.5 / 6.5  # each interval over AR, at their extremes
    assert verdict(judged, 1.25) == "met (the interval lies above it); decided by measured time"
    unmeasured = rows.assign(shadow=["chameleon_7b", "chameleon_7b", ""])
    assert judge(unmeasured, unmeasured.iloc[1], ["b"]).by == MODELLED  # both rows must be measured


def test_a_target_over_the_faster_of_two_is_not_met_without_both_and_rows_without_counts_decide_nothing():
    rows = pd.DataFrame([summary_row("ar", 1000.0, 1), summary_row("a", 50.0), summary_row("pac", 100.0)])
    judged = judge(rows, rows.iloc[1], ["pac", "scd"])
    assert judged.missing == ("scd",) and judged.point == 2.0
    assert verdict(judged, 1.25).startswith("not decided: this run has no `scd` row")
    assert verdict(judged, 2.5).startswith("missed")  # missed over the slower one is missed over the faster
    old = rows.drop(columns=["priced_context"])
    assert judge(old, old.iloc[1], ["pac"]).by == ""
    assert verdict(judge(old, old.iloc[1], ["pac"]), 1.25).startswith("not decided: these rows have no latency")
