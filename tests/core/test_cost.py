"""sjd/core/cost.py: the bytes, FLOPs and launches of one forward of the real architectures, and the drafter's
price in target forwards, against figures worked out by hand from the released configurations."""

import pytest

from sjd.core.cost import ARCHITECTURES, GPUS, byte_ratio, eagle_drafter, forward_cost, forward_seconds

CHAMELEON = ARCHITECTURES["chameleon_7b"]


def test_chameleon_7b_reads_its_layers_and_head():
    assert CHAMELEON.layer_parameters == 4 * 4096**2 + 3 * 4096 * 11008  # 202.4M
    assert CHAMELEON.parameters == 32 * CHAMELEON.layer_parameters + 65536 * 4096  # 6.745B, no embedding table
    assert ARCHITECTURES["llamagen_xl"].parameters == pytest.approx(0.752e9, rel=0.01)


def test_an_eagle_drafter_costs_a_fraction_of_a_target_forward_set_by_its_head():
    full = byte_ratio(eagle_drafter(CHAMELEON), CHAMELEON)
    cut = byte_ratio(eagle_drafter(CHAMELEON, head_rows=8192), CHAMELEON)
    assert full == pytest.approx(0.0748, abs=5e-4) and cut == pytest.approx(0.0400, abs=5e-4)


def test_a_window_of_64_at_batch_1_with_cfg_is_memory_bound_on_an_h100():
    cost = forward_cost(CHAMELEON, rows=2, width=64, context=2300)
    h100 = GPUS["H100"]
    assert cost.bytes / h100.bandwidth > cost.flops / h100.peak
    assert cost.kv_bytes == 2 * 2364 * 2 * 32 * 4096 * 2  # both rows' keys and values, every layer, bf16
    graphed = forward_cost(CHAMELEON, rows=2, width=64, context=2300, graphed=True)
    assert forward_seconds(cost, h100) - forward_seconds(graphed, h100) == pytest.approx(
        (cost.launches - 1) * h100.launch_s)  # fmt: skip
    assert forward_seconds(graphed, h100) == pytest.approx(cost.bytes / h100.bandwidth + h100.launch_s)


def test_a_wide_enough_batch_turns_compute_bound():
    h100 = GPUS["H100"]
    cost = forward_cost(CHAMELEON, rows=64, width=64, context=0)
    assert cost.flops / h100.peak > cost.bytes / h100.bandwidth
