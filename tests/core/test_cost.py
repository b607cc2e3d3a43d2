"""sjd/core/cost.py: the bytes, FLOPs and launches of one forward of the real architectures, and the drafter's
price in target forwards, against figures worked out by hand from the released configurations."""

import pytest

from sjd.core.cost import (
    ARCHITECTURES,
    BANDWIDTH_REACHED,
    COMPILED_FORWARD_S,
    EAGER_OP_S,
    EAGER_OP_S_RANGE,
    ENGINES,
    GPUS,
    LAUNCH_S,
    LAUNCH_S_RANGE,
    PEAK_REACHED,
    SYNC_S_RANGE,
    DecodeCounts,
    byte_ratio,
    corners,
    decode_seconds,
    draft_heads,
    drafter_price,
    eagle_drafter,
    engine_forward_seconds,
    forward_cost,
    forward_seconds,
    heads_price,
    mean_context,
    roofline_seconds,
)

CHAMELEON = ARCHITECTURES["chameleon_7b"]


def test_chameleon_7b_reads_its_layers_and_head():
    assert CHAMELEON.layer_parameters == 4 * 4096**2 + 3 * 4096 * 11008  # 202.4M
    assert CHAMELEON.parameters == 32 * CHAMELEON.layer_parameters + 65536 * 4096  # 6.745B, no embedding table
    assert ARCHITECTURES["llamagen_xl"].parameters == pytest.approx(0.752e9, rel=0.01)


def test_an_eagle_drafter_costs_a_fraction_of_a_target_forward_set_by_its_head():
    full = byte_ratio(eagle_drafter(CHAMELEON), CHAMELEON)
    cut = byte_ratio(eagle_drafter(CHAMELEON, head_rows=8192), CHAMELEON)
    assert full == pytest.approx(0.0748, abs=5e-4) and cut == pytest.approx(0.0400, abs=5e-4)
    assert drafter_price("chameleon_7b") == pytest.approx(full) and drafter_price("chameleon_7b", "codes") == cut
    assert drafter_price("llamagen_xl", "codes") == drafter_price("llamagen_xl")  # its head is all image codes
    with pytest.raises(ValueError, match="full or codes"):
        drafter_price("chameleon_7b", "half")


def test_a_window_of_64_at_batch_1_with_cfg_is_memory_bound_at_the_datasheet_peak_not_at_the_reached_one():
    """At an H100's datasheet peak a window of 64 with CFG (128 token rows) is bound by its bytes; at the share of
    the peak our GPU's forwards reach (PEAK_REACHED, fitted) its FLOPs take longer, so a wide window costs more
    than a narrow one, as the measured eager forwards did."""
    cost = forward_cost(CHAMELEON, rows=2, width=64, context=2300)
    h100 = GPUS["H100"]
    assert cost.bytes / h100.bandwidth > cost.flops / h100.peak
    assert cost.flops / (h100.peak * PEAK_REACHED) > cost.bytes / h100.bandwidth
    assert cost.kv_bytes == 2 * 2364 * 2 * 32 * 4096 * 2  # both rows' keys and values, every layer, bf16
    graphed = forward_cost(CHAMELEON, rows=2, width=64, context=2300, graphed=True)
    assert forward_seconds(cost, h100, LAUNCH_S) - forward_seconds(graphed, h100, LAUNCH_S) == pytest.approx(
        (cost.launches - 1) * LAUNCH_S)  # fmt: skip
    reached = cost.flops / (h100.peak * PEAK_REACHED)
    assert forward_seconds(graphed, h100, LAUNCH_S) == pytest.approx(reached + LAUNCH_S)
    at_one = forward_cost(CHAMELEON, rows=2, width=1, context=2300, graphed=True)
    assert forward_seconds(at_one, h100, LAUNCH_S) == pytest.approx(at_one.bytes / h100.bandwidth + LAUNCH_S)


def test_a_wide_enough_batch_turns_compute_bound():
    h100 = GPUS["H100"]
    cost = forward_cost(CHAMELEON, rows=64, width=64, context=0)
    assert cost.flops / h100.peak > cost.bytes / h100.bandwidth


def test_every_corner_of_the_plausible_range_prices_within_its_bounds():
    """corners spans each engine's constants: the bandwidth reached, the call and the sync costs, the eager call
    between the fitted timings' bounds; a decode at the slowest corner costs more than at the nominal constants,
    and at the fastest less."""
    h100 = GPUS["H100"]
    every = corners(h100)
    assert len(every) == 8 * len(ENGINES) and {c.engine.name for c in every} == set(ENGINES)
    eager = [c for c in every if c.engine.name == "eager"]
    assert {c.engine.op_s for c in eager} == set(EAGER_OP_S_RANGE) and EAGER_OP_S_RANGE[0] <= EAGER_OP_S
    assert {c.gpu.bandwidth_reached for c in every} == set(BANDWIDTH_REACHED)
    assert {c.gpu.sync_s for c in every} == set(SYNC_S_RANGE)
    assert {c.engine.op_s for c in every if c.engine.name != "eager"} == set(LAUNCH_S_RANGE)
    counts = DecodeCounts(forwards=100, context=1000, width=16, decoder_ops=300, syncs=2)
    for name in ENGINES:
        mine = [decode_seconds(counts, CHAMELEON, c.gpu, c.engine, 2) for c in every if c.engine.name == name]
        nominal = decode_seconds(counts, CHAMELEON, h100, ENGINES[name], 2)
        assert min(mine) < nominal < max(mine)


def test_the_compiled_engine_pays_its_fitted_host_time_a_forward_and_compiled_calls():
    cost = forward_cost(CHAMELEON, 2, 1, 500)
    compiled = ENGINES["compiled"]
    assert compiled.kernels == "compiled" and not compiled.graphed
    assert engine_forward_seconds(cost, GPUS["H200"], compiled) == pytest.approx(
        roofline_seconds(cost, GPUS["H200"]) + COMPILED_FORWARD_S)  # fmt: skip
    assert engine_forward_seconds(cost, GPUS["H200"], ENGINES["eager"]) == pytest.approx(
        forward_seconds(cost, GPUS["H200"], EAGER_OP_S))  # fmt: skip


def test_a_heads_call_costs_its_blocks_and_one_pass_of_the_head():
    """Four heads on Chameleon-7B: 4 x 2 x 4096^2 block weights and the 65,536-row head read once, 0.0597 of a
    target forward by bytes (0.0249 with the head cut to the 8,192 image codes); no layer, so no KV cache."""
    heads = draft_heads(CHAMELEON, 4)
    assert heads.parameters == 4 * 2 * 4096**2 + 65536 * 4096 and heads.kv_bytes_per_token("bfloat16") == 0
    assert heads_price("chameleon_7b", 4) == pytest.approx(byte_ratio(heads, CHAMELEON))
    assert heads_price("chameleon_7b", 4) == pytest.approx(0.0597, abs=5e-4)
    assert byte_ratio(draft_heads(CHAMELEON, 4, head_rows=8192), CHAMELEON) == pytest.approx(0.0249, abs=5e-4)
    assert heads_price("chameleon_7b", 4, "codes") == pytest.approx(0.0249, abs=5e-4)  # the image codes' rows
    with pytest.raises(ValueError, match="model.prices_as"):
        heads_price("no_such_model", 4)
    h100, graphed = GPUS["H100"], ENGINES["graphed"]
    base = DecodeCounts(forwards=5, context=100, width=16)
    headed = DecodeCounts(forwards=5, context=100, width=16, head_forwards=5, heads=4)
    one_call = roofline_seconds(forward_cost(heads, 2, 4, 100), h100) + graphed.op_s
    assert decode_seconds(headed, CHAMELEON, h100, graphed, 2) == pytest.approx(
        decode_seconds(base, CHAMELEON, h100, graphed, 2) + 5 * one_call)  # fmt: skip


def test_a_decode_costs_its_forwards_at_their_mean_context_and_its_own_calls():
    """decode_seconds against the sum worked per forward: while every forward is bound by its bytes, pricing
    each at its own context equals pricing all at the mean context."""
    committed = [1, 3, 2, 4, 6]
    assert mean_context(committed) == pytest.approx((0 + 1 + 4 + 6 + 10) / 5)
    h100, graphed = GPUS["H100"], ENGINES["graphed"]
    per_forward = sum(
        forward_seconds(forward_cost(CHAMELEON, 2, 16, c, graphed=True), h100, graphed.op_s) for c in (0, 1, 4, 6, 10)
    )
    counts = DecodeCounts(forwards=5, context=mean_context(committed), width=16, decoder_ops=100, syncs=1)
    own = 5 * (100 * graphed.op_s + h100.sync_s)
    assert decode_seconds(counts, CHAMELEON, h100, graphed, rows=2) == pytest.approx(per_forward + own)
    drafter = eagle_drafter(CHAMELEON)
    drafted = DecodeCounts(5, counts.context, 16, drafter_forwards=30, decoder_ops=100, syncs=1)
    one_draft = roofline_seconds(forward_cost(drafter, 2, 1, counts.context), h100) + graphed.op_s
    assert decode_seconds(drafted, CHAMELEON, h100, graphed, 2, drafter) == pytest.approx(
        per_forward + own + 30 * one_draft)  # fmt: skip
    with pytest.raises(ValueError, match="drafter's architecture"):
        decode_seconds(drafted, CHAMELEON, h100, graphed, 2)


def test_an_eager_forward_of_a_7b_model_is_bound_by_its_host_calls():
    """The fitted eager engine prices a 7B forward at several times its roofline (what the GPU page measured),
    so a decoder's own calls weigh beside it; graphed, the roofline dominates."""
    cost = forward_cost(CHAMELEON, 2, 1, 1000)
    eager = forward_seconds(cost, GPUS["H100"], EAGER_OP_S)
    assert eager > 4 * roofline_seconds(cost, GPUS["H100"])
    graphed = forward_seconds(forward_cost(CHAMELEON, 2, 1, 1000, graphed=True), GPUS["H100"], LAUNCH_S)
    assert graphed < 1.01 * roofline_seconds(cost, GPUS["H100"])
