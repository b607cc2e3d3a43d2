"""studies/engine_page.py: the engine page reads its verdicts from the intervals and shows syncs by cache."""

import pandas as pd

from studies.engine_page import render, render_engine_page, verdict


def engine_rows() -> pd.DataFrame:
    common = {"model": "toy", "window": 16, "prompts": 3, "torch": "2.13.0", "git_hash": "abc",
              "command": "python scripts/bench_engine.py --model toy", "host_ms_per_forward": 1.0, "warmup_s": 2.0,
              "latency_s": 0.1, "vs_ar": 1.5, "vs_ar_lo": 1.2, "vs_ar_hi": 1.8}  # fmt: skip
    rows = [("eager_dynamic", 1.0, 1.0, 1.0), ("eager_static", 0.8, 0.7, 0.9), ("compiled_static", 1.1, 0.9, 1.3)]
    return pd.DataFrame(
        [
            {
                **common,
                "decoder": "sjd",
                "batch": 1,
                "engine": e,
                "vs_eager_dynamic": r,
                "vs_eager_dynamic_lo": lo,
                "vs_eager_dynamic_hi": hi,
            }
            for e, r, lo, hi in rows
        ]  # fmt: skip
    )


def test_verdicts_come_from_the_intervals():
    assert verdict(1.3, 1.1, 1.5) == "faster"
    assert verdict(0.8, 0.7, 0.9) == "slower"
    assert verdict(1.1, 0.9, 1.3) == "not distinguishable at this size"
    assert verdict(1.1, float("nan"), float("nan")) == "no interval"


def test_the_page_states_each_engine_against_the_default_and_the_syncs_by_cache(tmp_path):
    syncs = pd.DataFrame(
        [
            {
                "decoder": "sjd",
                "batch": 1,
                "window": 16,
                "cache": c,
                "decoder_syncs_per_iter": 1.05,
                "forward_syncs_per_iter": f,
                "command": "python scripts/count_syncs.py",
                "git_hash": "abc",
            }
            for c, f in (("dynamic", 1.0), ("static", 0.0))
        ]  # fmt: skip
    )
    text = render(engine_rows(), syncs)
    lines = {line.split("|")[3].strip(): line for line in text.splitlines() if line.startswith("| sjd |")}
    assert "slower" in lines["eager_static"] and "not distinguishable at this size" in lines["compiled_static"]
    assert "(reference)" in lines["eager_dynamic"]
    assert "forward (dynamic)" in text and "forward (static)" in text
    engine_rows().to_csv(tmp_path / "engine.csv", index=False)
    assert render_engine_page(tmp_path, tmp_path) == tmp_path / "engine.md"
    assert render_engine_page(tmp_path / "none", tmp_path) is None
