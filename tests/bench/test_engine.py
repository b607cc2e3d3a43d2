"""The engine bench's summary (sjd/bench/engine.py, run by scripts/bench_engine.py) on made-up timings: latency per
image, host time per forward, and its ratios paired by prompt batch (tests/project/test_documented_commands.py runs
the command itself at tiny size)."""

import pandas as pd
import pytest

from sjd.bench.engine import ENGINES, summarise

# Seconds of each (decoder, engine) for prompt batches 0, 1, 2 of two images: SJD twice as fast as AR on every
# engine, the compiled engine 1.25x the eager ones; the model takes half of each.
SPEED = {"eager_dynamic": 1.0, "eager_static": 1.0, "compiled_static": 1.25}
RECORDS = pd.DataFrame(
    [
        {
            "decoder": decoder,
            "engine": engine,
            "batch": 2,
            "unit": unit,
            "latency_s": (unit + 1) * (2.0 if decoder == "ar" else 1.0) / SPEED[engine],
            "model_s": (unit + 1) * (1.0 if decoder == "ar" else 0.5) / SPEED[engine],
            "forwards": 10 if decoder == "ar" else 4,
            "forwards_per_image": 10 if decoder == "ar" else 4,
        }
        for unit in (2, 0, 1)
        for decoder in ("ar", "sjd")
        for engine in ENGINES
    ]  # fmt: skip
)


def test_each_pair_is_summarised_with_ratios_to_its_eager_self_and_to_ar_on_its_engine():
    warmup = {(d, e): 1.0 for d in ("ar", "sjd") for e in ENGINES}
    table = summarise(RECORDS, warmup).set_index(["decoder", "engine"])
    assert len(table) == 6 and (table.batch == 2).all() and (table.warmup_s == 1.0).all()
    ar = table.loc[("ar", "eager_dynamic")]
    assert ar.latency_s == pytest.approx(2.0)  # mean over batches 2, 4, 6 s, a batch of two images
    assert ar.host_ms_per_forward == pytest.approx(1000 * (1 + 2 + 3) / 3 / 10)
    for (decoder, engine), row in table.iterrows():
        assert row.vs_eager_dynamic == pytest.approx(SPEED[engine])
        assert row.vs_ar == pytest.approx(2.0 if decoder == "sjd" else 1.0)
        for ratio in ("vs_eager_dynamic", "vs_ar"):  # every batch gives the same ratio: no spread to show
            assert row[f"{ratio}_lo"] == pytest.approx(row[ratio]) == row[f"{ratio}_hi"]
