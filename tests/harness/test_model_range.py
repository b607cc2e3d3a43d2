"""sjd.harness.model_range: a modelled ratio priced at every corner of the cost model's plausible range, its spread
over prompts carried over from the run's own interval."""

import json

import numpy as np
import pandas as pd
import pytest

from sjd.core.cost import ENGINES, GPUS, Corner
from sjd.harness.model_range import corner_seconds, priced, ratio_range, with_engine_calls


def summary_row(decoder: str, forwards: float, width: float = 16, calls: float = 100.0, cls: str = "TestDecoder"):
    """A summary row as a run on a stand-in priced as Chameleon-7B records it (a class no sync count knows keeps
    its own calls on every engine)."""
    return pd.Series({"decoder": decoder, "n_forward": forwards, "priced_context": 1000.0, "priced_width": width,
                      "decoder_ops_per_iter": calls, "syncs_per_iter": 1.0, "prices_as": "chameleon_7b",
                      "sampling": json.dumps({"cfg_scale": 3.0}), "decoder_classes": json.dumps({decoder: cls}),
                      "decoder_configs": json.dumps({decoder: {"window": int(width)}}), "compiled": False,
                      "drafter_forwards": np.nan})  # fmt: skip


def test_a_ratio_of_forwards_alone_is_the_same_at_every_corner():
    """Two decoders that differ only in their forwards: every corner gives the ratio of forwards, so the range is
    that ratio times the spread over prompts, on every engine."""
    mine, theirs = summary_row("a", 50.0), summary_row("b", 100.0)
    modelled = ratio_range(mine, [theirs], [(0.9, 1.1)])
    assert modelled.point == pytest.approx(2.0) and modelled.over_prompts
    assert (modelled.lo, modelled.hi) == pytest.approx((1.8, 2.2))
    assert all(v == pytest.approx((2.0, 1.8, 2.2)) for v in modelled.engines.values())
    assert set(modelled.engines) == set(ENGINES)
    bare = ratio_range(mine, [theirs], [(np.nan, np.nan)])  # no interval over prompts: constants only
    assert not bare.over_prompts and (bare.lo, bare.hi) == pytest.approx((2.0, 2.0))


def test_a_narrow_decoder_against_a_wide_one_differs_by_engine():
    """A window of 16 taking 1.3x the forwards of a window of 256: graphed, the wide window's FLOPs dominate its
    forward and the narrow one wins by far; eager, every forward pays its host calls first and the win shrinks."""
    narrow, wide = summary_row("narrow", 130.0, 16), summary_row("wide", 100.0, 256)
    modelled = ratio_range(narrow, [wide], [(1.0, 1.0)])
    graphed, eager = modelled.engines["graphed"], modelled.engines["eager"]
    assert graphed[1] > 1.5 > eager[2]  # the graphed range lies above 1.5, the eager one below
    assert modelled.lo == pytest.approx(min(v[1] for v in modelled.engines.values()))
    assert modelled.hi == pytest.approx(max(v[2] for v in modelled.engines.values()))


def test_against_several_references_the_ratio_is_over_the_faster_at_each_corner():
    mine = summary_row("a", 50.0)
    slow, fast = summary_row("slow", 200.0), summary_row("fast", 80.0)
    modelled = ratio_range(mine, [slow, fast], [(1.0, 1.0), (0.95, 1.05)])
    assert modelled.point == pytest.approx(80 / 50) and set(modelled.faster.values()) == {"fast"}
    assert (modelled.lo, modelled.hi) == pytest.approx((0.95 * 1.6, 1.05 * 1.6))


def test_the_compiled_engine_pays_the_compiled_count_of_a_counted_decoder():
    """An SJD row of an eager run: on the compiled engine its calls are the ones counted compiled (fewer), on the
    others the ones the run recorded."""
    row = summary_row("sjd", 100.0, cls="SJDDecoder")
    compiled = Corner(ENGINES["compiled"], GPUS["H100"])
    assert with_engine_calls(row, compiled)["decoder_ops_per_iter"] < row["decoder_ops_per_iter"]
    assert with_engine_calls(row, Corner(ENGINES["eager"], GPUS["H100"])) is row
    assert corner_seconds(row, compiled) > 0 and priced(row)
    assert not priced(row.drop("priced_context"))
