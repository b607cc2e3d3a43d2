"""sjd.harness.contention: the rule that marks a run's latencies unreliable, on synthetic readings."""

import math

import pytest

from sjd.harness import contention
from sjd.harness.contention import Reading


def assess(load_start: float, load_end: float, cpu_s: float, device: str = "cpu", cores: int = 4) -> dict:
    """Readings of a run free to use all of a `cores`-core machine (not pinned), with no sampler."""
    start, end = Reading(load_start, 100.0, 5.0), Reading(load_end, 110.0, 5.0 + cpu_s)
    return contention.assess(start, end, device, cores, machine=cores)


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


def clock_of(others_cores: list[float], own_cores: float = 1.0):
    """A LoadSampler clock over one-second intervals in which other work keeps `others_cores[i]` cores busy."""
    state = {"t": 0.0, "busy": 0.0, "own": 0.0, "i": 0}

    def clock():
        reading = (state["t"], state["busy"], state["own"])
        i = min(state["i"], len(others_cores) - 1)
        state["t"] += 1.0
        state["busy"] += others_cores[i] + own_cores
        state["own"] += own_cores
        state["i"] += 1
        return reading

    return clock


def sampled(others_cores: list[float]) -> list[tuple[float, float]]:
    sampler = contention.LoadSampler(clock=clock_of(others_cores))
    sampler._last = sampler.clock()
    for _ in others_cores:
        sampler.tick()
    return sampler.samples


@pytest.mark.parametrize(
    ("others", "reliable", "why"),
    [
        ([0.05] * 70, True, "a quiet machine: the run's own cores are not other work"),
        ([0.3] * 70, True, "a steady 0.3 cores of other work, under the limit throughout"),
        ([0.6] * 70, False, "0.6 cores on average: above half a core, though never near the 2 cores"),
        ([0.1] * 30 + [1.5] * 12 + [0.1] * 28, False, "a 12 s burst of 1.5 cores mid-run, 0.34 on average"),
        ([0.1] * 30 + [1.5] * 2 + [0.1] * 38, True, "a 2 s blip: no 10 s window averages over half a core"),
    ],
)
def test_other_work_sampled_during_the_decode_decides_on_both_sides_of_the_limit(others, reliable, why):
    samples = sampled(others)
    load = contention.assess(Reading(0.3, 100.0, 5.0), Reading(1.2, 110.0, 15.0), "cpu", 2, samples, machine=2)
    assert load["latency_reliable"] is reliable, why
    assert load["load_samples"] == len(others)
    assert load["others_cores_mean"] == pytest.approx(sum(others) / len(others))
    assert load["others_cores_peak"] >= load["others_cores_mean"]
    if not reliable:
        assert "other work" in contention.warning(load)


def test_a_pinned_run_is_judged_by_its_own_cores_where_the_sampler_watched_them():
    """Two lanes on a 2-core machine, each pinned to one core: the machine-wide load (2 before, 3 after) counts the
    neighbour, which never ran on this run's core. The sampler, which reads this core alone, decides; without
    samples, or on a run free to use every core, the load still counts."""
    start, end = Reading(2.0, 100.0, 5.0), Reading(3.0, 110.0, 14.5)  # 0.95 of a core of its own
    quiet_core = sampled([0.05] * 70)
    pinned = contention.assess(start, end, "cpu", cores=1, samples=quiet_core, machine=2)
    assert pinned["latency_reliable"] and pinned["machine_cores"] == 2 and pinned["usable_cores"] == 1
    assert not contention.assess(start, end, "cpu", cores=1, samples=sampled([0.1] * 30 + [0.9] * 40), machine=2)[
        "latency_reliable"
    ], "other work on the pinned core itself still counts"
    assert not contention.assess(start, end, "cpu", cores=1, samples=None, machine=2)["latency_reliable"]
    assert not contention.assess(start, end, "cpu", cores=1, samples=quiet_core, machine=1)["latency_reliable"]


def test_the_sampler_takes_real_readings_while_work_runs():
    """The thread samples during the work and the readings are real numbers (here /proc/stat is readable, so a
    NaN reading, which drops the sample, would leave it empty); the attribution of own and other work is tested
    on the synthetic clock above."""
    assert math.isfinite(contention.machine_busy_s())
    with contention.LoadSampler(interval=0.05) as sampler:
        sum(i * i for i in range(2_000_000))
    verdict = contention.others_verdict(sampler.samples)
    assert verdict["load_samples"] >= 2 and math.isfinite(verdict["others_cores_mean"])
