"""sjd.harness.contention: the rule that marks a run's latencies unreliable, on synthetic readings."""

import math

import pytest

from sjd.harness import contention
from sjd.harness.contention import Reading


def assess(load_start: float, load_end: float, cpu_s: float, device: str = "cpu", cores: int = 4) -> dict:
    return contention.assess(Reading(load_start, 100.0, 5.0), Reading(load_end, 110.0, 5.0 + cpu_s), device, cores)


def test_a_quiet_machine_keeps_its_latencies():
    # 4 cores, nothing else running, the run kept two of them busy (its own load shows at the end)
    load = assess(0.3, 2.2, cpu_s=20.0)
    assert load["cpu_per_wall"] == pytest.approx(2.0) and load["latency_reliable"]
    assert contention.warning(load) == ""


def test_other_work_above_the_cores_marks_latencies_unreliable():
    assert not assess(5.0, 2.0, cpu_s=20.0)["latency_reliable"]  # busy before the decode began
    assert not assess(0.5, 6.5, cpu_s=20.0)["latency_reliable"]  # 6.5 - the run's own 2 > 4 cores
    assert assess(0.5, 5.9, cpu_s=20.0)["latency_reliable"]  # 3.9 others: the cores were not oversubscribed


def test_a_cpu_run_that_got_under_half_a_core_is_unreliable_but_a_gpu_run_is_judged_by_load_only():
    starved = assess(1.0, 1.0, cpu_s=3.0)  # 0.3 s of CPU per wall second
    assert not starved["latency_reliable"]
    assert "UNRELIABLE" in contention.warning(starved) and "0.30" in contention.warning(starved)
    assert assess(1.0, 1.0, cpu_s=3.0, device="cuda:0")["latency_reliable"]
    assert not assess(9.0, 1.0, cpu_s=3.0, device="cuda")["latency_reliable"]


def test_an_unknown_load_is_not_contention_and_the_readings_are_real():
    assert assess(math.nan, math.nan, cpu_s=20.0)["latency_reliable"]
    before = contention.sample()
    sum(i * i for i in range(200_000))  # some CPU work between the readings
    load = contention.assess(before, contention.sample(), "cpu")
    assert load["usable_cores"] >= 1 and load["cpu_per_wall"] > 0 and load["load_1min_start"] >= 0
