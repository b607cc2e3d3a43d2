"""sjd.harness.pricing: each sample priced as the real architecture its model stands for, with the decoder's own
calls and syncs from results/syncs.csv, and the summary's fe_compression and modelled speedup with intervals."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from test_run import run_py

from sjd.core.cost import (
    ARCHITECTURES,
    ENGINES,
    GPUS,
    DecodeCounts,
    decode_seconds,
    drafter_price,
    eagle_drafter,
    heads_price,
)
from sjd.harness.decoder_configs import decoder_config
from sjd.harness.pricing import counted_overheads, decoder_overheads, sample_prices
from sjd.harness.results import summary_rows

CHAMELEON = ARCHITECTURES["chameleon_7b"]
META = {"model": "standin", "prices_as": "chameleon_7b", "drafter_byte_ratio": drafter_price("chameleon_7b"),
        "sampling": {"cfg_scale": 3.0},
        "decoder_classes": {"ar": "ARDecoder", "sjd": "SJDDecoder", "hybrid": "SJDDrafterDecoder",
                            "headed": "SJDHeadsDecoder"},
        "decoder_configs": {"sjd": {"window": 16}, "hybrid": {"window": 16}, "headed": {"window": 16}}}  # fmt: skip


def counted(name: str, window: float | None) -> tuple[float, float]:
    table = counted_overheads()
    row = table[(table["decoder"] == name) & (table["cache"] == "dynamic")]
    row = row[row["window"] == window] if window is not None else row
    return float(row["ops"].iloc[0]), float(row["syncs"].iloc[0])


def test_a_decoder_takes_the_counts_of_the_config_its_settings_match_at_the_nearest_window():
    """EAGLE-1's static tree and EAGLE-2's dynamic one share a class but not their counts: each run row takes the
    counted config whose settings agree with its own most; the window picks among a config's counts."""
    sampled = {k: str(v) for k, v in decoder_config("eagle_sampled").items()}
    dynamic = {k: str(v) for k, v in decoder_config("eagle").items()} | {"window": 16}
    assert decoder_overheads("EagleDecoder", sampled, "dynamic") == counted("eagle_sampled", None)
    assert decoder_overheads("EagleDecoder", dynamic, "dynamic") == counted("eagle", 16.0)
    sjd = {k: str(v) for k, v in decoder_config("sjd").items()}
    assert decoder_overheads("SJDDecoder", sjd | {"window": 50}, "dynamic") == counted("sjd", 64.0)
    assert decoder_overheads("SJDDecoder", sjd | {"window": 20}, "dynamic") == counted("sjd", 16.0)
    assert all(math.isnan(x) for x in decoder_overheads("NoSuchDecoder", {}, "dynamic"))


def test_a_compiled_run_takes_the_counts_with_compiled_kernels_where_its_class_was_counted_so():
    """compile=true compiles the iteration's kernels (sjd.decoders.kernels), so a compiled run is priced at the calls
    counted with them (scripts/count_syncs.py --kernels compiled): fewer calls, the same syncs; a class counted
    only eagerly keeps its eager counts."""
    table = counted_overheads()
    sjd = {k: str(v) for k, v in decoder_config("sjd").items()}
    eager = decoder_overheads("SJDDecoder", sjd | {"window": 16}, "static")
    compiled = decoder_overheads("SJDDecoder", sjd | {"window": 16}, "static", compiled=True)
    assert compiled[0] < eager[0] and compiled[1] == eager[1]
    only_eager = table[table["kernels"] == "eager"].assign(cls="OnlyEager")
    assert decoder_overheads("OnlyEager", sjd | {"window": 16}, "static", only_eager, compiled=True) == eager


def rows(decoder: str, accepted: list[int], extras: dict, n: int = 3) -> list[dict]:
    return [{"decoder": decoder, "prompt_id": str(i), "n_tokens": sum(accepted), "n_forward": len(accepted),
             "latency_s": 1.0, "prefill_s": 0.0, "decode_s": 1.0, "model_s": 0.5, "accepted": accepted,
             "peak_mem_mb": 1.0, "peak_mem_kind": "process_rss", "extras": extras} for i in range(n)]  # fmt: skip


def test_a_sample_is_priced_by_its_forwards_contexts_width_drafter_and_decoder_counts():
    table = pd.DataFrame(
        rows("ar", [1] * 64, {"window_inputs": 63})
        + rows("hybrid", [8] * 8, {"window_inputs": 112, "drafter_forwards": 40})
    )
    prices = sample_prices(table, META)
    ops, syncs = decoder_overheads("SJDDrafterDecoder", {"window": 16}, "dynamic")
    hybrid = prices.iloc[-1]
    assert hybrid["priced_context"] == pytest.approx(28.0) and hybrid["priced_width"] == pytest.approx(14.0)
    assert hybrid["priced_forwards"] == pytest.approx(8 + 40 * 0.0748, rel=1e-3)  # the drafter's byte ratio
    by_hand = decode_seconds(DecodeCounts(8, 28.0, 14.0, 40, ops, syncs), CHAMELEON, GPUS["H100"], ENGINES["graphed"],
                             2, eagle_drafter(CHAMELEON))  # fmt: skip
    assert hybrid["modelled_s"] == pytest.approx(by_hand)
    assert hybrid["modelled_eager_s"] > hybrid["modelled_s"]  # eager pays every call at its fitted host time
    assert prices.iloc[0]["priced_width"] == 1.0  # AR: one input a forward (the prefill's counted as one)
    unpriced = sample_prices(table, {**META, "prices_as": None})
    assert unpriced.isna().all().all()


def test_a_heads_call_is_priced_at_the_heads_bytes_in_the_sample_and_its_summary():
    """8 target forwards and 8 calls of 4 heads: priced forwards 8 + 8 x the heads' byte ratio, the modelled time
    the decode's with the calls, and the summary's fe_compression from those priced forwards; on a model with no
    real architecture a heads row has no fe_compression (nothing prices its calls)."""
    table = pd.DataFrame(rows("ar", [1] * 64, {"window_inputs": 63})
                         + rows("headed", [8] * 8, {"window_inputs": 112, "head_forwards": 8, "heads": 4}))  # fmt: skip
    prices = sample_prices(table, META)
    headed = prices.iloc[-1]
    assert headed["priced_forwards"] == pytest.approx(8 + 8 * heads_price("chameleon_7b", 4))
    ops, syncs = decoder_overheads("SJDHeadsDecoder", {"window": 16}, "dynamic")
    counts = DecodeCounts(8, 28.0, 14.0, head_forwards=8, heads=4, decoder_ops=ops, syncs=syncs)
    by_hand = decode_seconds(counts, CHAMELEON, GPUS["H100"], ENGINES["graphed"], 2)
    if not math.isnan(ops):
        assert headed["modelled_s"] == pytest.approx(by_hand)
    summary = summary_rows(table, "ar", META).set_index("decoder")
    assert summary.loc["headed", "heads"] == 4 and summary.loc["headed", "head_forwards"] == 8
    assert summary.loc["headed", "fe_compression"] == pytest.approx(64 / (8 + 8 * heads_price("chameleon_7b", 4)))
    unpriced = summary_rows(table, "ar", {**META, "prices_as": None}).set_index("decoder")
    assert math.isnan(unpriced.loc["headed", "fe_compression"]) and unpriced.loc["ar", "fe_compression"] == 1.0


def test_a_drafter_or_heads_on_the_image_codes_head_is_priced_at_those_rows():
    """`decoder.drafter.head: codes` (or `decoder.heads.head`) prices the drafter forward and the heads call at the
    image codes' rows of the LM head (8,192 of Chameleon's 65,536), and the modelled time with them."""
    table = pd.DataFrame(rows("hybrid", [8] * 8, {"window_inputs": 112, "drafter_forwards": 40})
                         + rows("headed", [8] * 8, {"window_inputs": 112, "head_forwards": 8, "heads": 4}))  # fmt: skip
    codes_head = {"weights": "x", "head": "codes"}
    configs = {"hybrid": {"window": 16, "drafter": codes_head}, "headed": {"window": 16, "heads": codes_head}}
    cut = {**META, "decoder_configs": configs}
    full, codes = sample_prices(table, META), sample_prices(table, cut)
    assert codes.iloc[0]["priced_forwards"] == pytest.approx(8 + 40 * drafter_price("chameleon_7b", "codes"))
    assert codes.iloc[-1]["priced_forwards"] == pytest.approx(8 + 8 * heads_price("chameleon_7b", 4, "codes"))
    assert (codes["draft_head_rows"] == 8192).all() and (full["draft_head_rows"] == 65536).all()
    assert (codes["modelled_s"] < full["modelled_s"]).all()


def test_the_summary_sets_modelled_speedup_beside_step_compression_with_paired_intervals():
    """Same target forwards, but one decoder spends 40 drafter forwards an image: equal step compression, lower
    fe_compression and modelled speedup, each with an interval over prompts (3 prompts, varied contexts)."""
    table = pd.DataFrame(
        rows("ar", [1] * 64, {"window_inputs": 63})
        + rows("sjd", [8] * 8, {"window_inputs": 112})
        + rows("hybrid", [8] * 8, {"window_inputs": 112, "drafter_forwards": 40})
    )
    for i in (4, 7):  # prompt 1 of sjd and hybrid commits late: a later mean context, so the units differ
        table.at[i, "accepted"] = [2] * 4 + [12] * 4
    summary = summary_rows(table, "ar", META).set_index("decoder")
    assert summary.loc["sjd", "step_compression"] == summary.loc["hybrid", "step_compression"] == 8.0
    assert summary.loc["hybrid", "fe_compression"] < summary.loc["sjd", "fe_compression"] == 8.0
    assert summary.loc["hybrid", "modelled_speedup"] < summary.loc["sjd", "modelled_speedup"]
    for column in ("fe_compression", "modelled_speedup", "modelled_efficiency", "modelled_eager_speedup"):
        lo, hi = summary.loc["hybrid", f"{column}_lo"], summary.loc["hybrid", f"{column}_hi"]
        assert lo - 1e-9 <= summary.loc["hybrid", column] <= hi + 1e-9
    assert summary.loc["sjd", "modelled_efficiency"] == pytest.approx(summary.loc["sjd", "modelled_speedup"] / 8.0)
    # over the cost model's constants too: every engine, bandwidth, launch and sync costs (sjd.harness.model_range)
    for column in ("modelled_speedup", "modelled_efficiency", "modelled_eager_speedup"):
        ranged = column.replace("eager_", "")
        lo, hi = summary.loc["hybrid", f"{ranged}_range_lo"], summary.loc["hybrid", f"{ranged}_range_hi"]
        assert lo <= summary.loc["hybrid", f"{column}_lo"] and summary.loc["hybrid", f"{column}_hi"] <= hi
    assert summary.loc["hybrid", "modelled_speedup_range_hi"] > 1.2 * summary.loc["hybrid", "modelled_speedup_range_lo"]
    assert np.isnan(summary.loc["ar", "modelled_speedup_range_lo"])


@pytest.mark.slow
def test_the_documented_command_writes_fe_compression_and_a_modelled_speedup(tmp_path):
    """`python run.py model=standin_lumina_512_cal decoder=csjd_pac_drafter prompts.n=2 warmup=0`: the drafter hybrid's
    fe_compression is well below its step compression, and its modelled speedup on an H100 is in the summary."""
    run_dir = tmp_path / "run"
    proc = run_py("model=standin_lumina_512_cal", "decoder=csjd_pac_drafter", "prompts.n=2", "warmup=0",
                  f"hydra.run.dir={run_dir}", "results_csv=null", "save_images=false")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = pd.read_csv(run_dir / "summary.csv").set_index("decoder")
    hybrid = summary.loc["csjd_pac_drafter"]
    assert hybrid["fe_compression"] < 0.7 * hybrid["step_compression"]
    assert 0 < hybrid["modelled_speedup"] < hybrid["step_compression"]
    assert hybrid["modelled_speedup_lo"] <= hybrid["modelled_speedup"] <= hybrid["modelled_speedup_hi"]
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["decoder_classes"]["csjd_pac_drafter"] == "SJDPACDrafterDecoder"
