"""The cost model's constants are fitted on our own GPU timings (results/gpu_forward_latency.csv), with SJD's decodes
held out: the constants sjd/core/cost.py carries are that fit, and the held-out error is computed, not typed."""

from dataclasses import replace

import pandas as pd
import pytest

from sjd.core.cost import (
    ARCHITECTURES,
    COMPILED_FORWARD_S,
    EAGER_OP_S,
    EAGER_OP_S_RANGE,
    ENGINES,
    GPUS,
    PEAK_REACHED,
    DecodeCounts,
    decode_seconds,
)
from sjd.core.cost_fit import Timing, fit_constants
from studies.cost_fit import GPU_CSV, fit_from_csv, fit_section, gpu_timings

CHAMELEON = ARCHITECTURES["chameleon_7b"]


@pytest.fixture(scope="module")
def fit():
    return fit_from_csv()


def test_the_constants_the_model_carries_are_the_fit_of_our_gpu_rows(fit):
    assert EAGER_OP_S == pytest.approx(fit.op_s, rel=1e-3)
    assert PEAK_REACHED == pytest.approx(fit.peak_reached, abs=1e-9)
    assert COMPILED_FORWARD_S == pytest.approx(fit.forward_s, rel=1e-3)
    assert EAGER_OP_S_RANGE == pytest.approx(fit.op_s_range, rel=1e-3)
    assert ENGINES["eager"].op_s == EAGER_OP_S and ENGINES["compiled"].forward_s == COMPILED_FORWARD_S


def test_the_held_out_decodes_are_sjd_s_and_their_error_is_the_models_price_of_them(fit):
    """Every SJD decode is held out and no other timing is; each held-out error is the fitted model's price of that
    decode (recomputed here from its counts) over its measured time."""
    timings = gpu_timings(pd.read_csv(GPU_CSV))
    held = [t for t in timings if t.held_out]
    fitted = [t for t in timings if not t.held_out]
    assert held and all("sjd16" in t.label for t in held) and not any("sjd16" in t.label for t in fitted)
    gpu = replace(GPUS["H200"], peak_reached=fit.peak_reached)
    for timing, error in zip(held, fit.errors(held_out=True)):
        engine = ENGINES[timing.engine]
        fitted_constant = {"op_s": fit.op_s} if timing.engine == "eager" else {"forward_s": fit.forward_s}
        engine = replace(engine, **fitted_constant)
        counts = DecodeCounts(1.0, timing.context, timing.width, decoder_ops=timing.decoder_ops, syncs=timing.syncs)
        assert error == pytest.approx(decode_seconds(counts, CHAMELEON, gpu, engine, 2) / timing.seconds - 1)
    text = "\n".join(fit_section())
    assert "| lumina sjd16 decode, eager | eager | held out |" in text and "on the held-out ones" in text


def test_a_held_out_timing_moves_no_constant_and_a_fitted_one_does():
    timings = gpu_timings(pd.read_csv(GPU_CSV))
    base = fit_constants(timings, CHAMELEON, GPUS["H200"])
    slower = [replace(t, seconds=2 * t.seconds) if t.held_out else t for t in timings]
    moved = fit_constants(slower, CHAMELEON, GPUS["H200"])
    assert (moved.op_s, moved.peak_reached, moved.forward_s) == (base.op_s, base.peak_reached, base.forward_s)
    assert moved.errors(held_out=True) != base.errors(held_out=True)
    refit = [replace(t, seconds=2 * t.seconds) if t.engine == "compiled" and not t.held_out else t for t in timings]
    assert fit_constants(refit, CHAMELEON, GPUS["H200"]).forward_s > base.forward_s


def test_the_fit_recovers_the_constants_that_made_its_timings():
    """Timings priced by the model at known constants give those constants back, with no error."""
    gpu = replace(GPUS["H200"], peak_reached=0.5)
    eager, compiled = replace(ENGINES["eager"], op_s=9e-6), replace(ENGINES["compiled"], forward_s=7e-3)
    shapes = [(1, 2000.0, 0.0, 0.0), (16, 2000.0, 0.0, 0.0), (64, 2000.0, 0.0, 0.0), (1, 100.0, 40.0, 0.1)]
    timings = [Timing(f"e{i}", "eager", 2, w, c, decode_seconds(DecodeCounts(1, c, w, decoder_ops=o, syncs=s),
                                                             CHAMELEON, gpu, eager, 2), o, s)
               for i, (w, c, o, s) in enumerate(shapes)]  # fmt: skip
    counts = DecodeCounts(1, 100.0, 1, decoder_ops=24, syncs=0.1)
    timings.append(Timing("c", "compiled", 2, 1, 100.0, decode_seconds(counts, CHAMELEON, gpu, compiled, 2), 24, 0.1))
    fit = fit_constants(timings, CHAMELEON, GPUS["H200"])
    assert fit.peak_reached == pytest.approx(0.5) and fit.op_s == pytest.approx(9e-6, rel=1e-6)
    assert fit.forward_s == pytest.approx(7e-3, rel=1e-6)
    assert max(abs(e) for e in fit.errors(held_out=False)) < 1e-9
    with pytest.raises(ValueError, match="eager and compiled timings"):
        fit_constants(timings[:-1], CHAMELEON, GPUS["H200"])
