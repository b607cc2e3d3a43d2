"""Whether a run's latencies can be trusted: what else loaded the machine while it decoded.

Two readings bracket the decode (`sample` before, `sample` after, `assess` on the pair):
the 1-minute load average (os.getloadavg: runnable threads, machine-wide) and the process's CPU
time (time.process_time, every thread of this process) against the wall time between them.

The rule (`contended`): latencies are unreliable when either
- other work outnumbered the cores this run may use (os.sched_getaffinity, else os.cpu_count):
  the load before decoding, or the load after it less the cores this run kept busy (its CPU time
  over wall time), exceeds those cores (not counted for a pinned run the sampler below watched: see there); or
- on a CPU device, the process ran less than MIN_CPU_PER_WALL of the wall time on a core: its
  threads waited for one. (A GPU run's CPU thread may sleep on the device, so there only the load counts.)

Two readings miss a burst in the middle of a long run, and a load average cannot tell this run's threads
from others'. So a `LoadSampler` also runs beside the decode: every `interval` seconds it reads the
busy CPU time of the cores this process may use (/proc/stat) and this process's own (time.process_time),
and keeps *other work* in cores, (busy - own) / wall, per interval. `others_verdict` marks the latencies unreliable when
other work averaged more than OTHERS_LIMIT cores over the decode, or over any window of WINDOW_S seconds
or more. Where /proc/stat cannot be read (not Linux), only the two readings count.

A run pinned to some of the machine's cores (taskset, a cluster's cgroup) is judged by the sampler alone where
it took samples: the load average counts runnable threads on every core, so a neighbour pinned to another core
would mark it contended though nothing ran on its own. What the sampler cannot see, a neighbour's share of
memory bandwidth and the last-level cache, slows AR and the decoders of one run alike, since they alternate.

A contended run slows AR's many one-token forwards far more than a parallel decoder's few wide
ones, which inflates the latency speedup; step compression and forward counts are unaffected.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MIN_CPU_PER_WALL = 0.5
OTHERS_LIMIT = 0.5  # cores of other work, on average over the decode or over any WINDOW_S window
WINDOW_S = 10.0
SAMPLE_INTERVAL_S = 1.0
LOAD_COLUMNS = ("load_1min_start", "load_1min_end", "usable_cores", "machine_cores", "cpu_per_wall",
                "latency_reliable", "others_cores_mean", "others_cores_peak", "load_samples")  # fmt: skip


@dataclass(frozen=True)
class Reading:
    load_1min: float
    wall_s: float
    cpu_s: float


def sample() -> Reading:
    """The load average, the wall clock and this process's CPU time, now."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return Reading(load, time.perf_counter(), time.process_time())


def usable_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_cores() -> int:
    """The cores of the whole machine, whichever this process may use."""
    return os.cpu_count() or 1


def contended(
    load_start: float, load_end: float, cores: int, cpu_per_wall: float, on_cpu: bool, count_load: bool = True
) -> bool:
    """The rule of the module docstring. An unknown load (NaN) does not count as contention; `count_load` false
    (a pinned run its sampler watched) leaves the machine-wide load average out."""
    others_after = load_end - cpu_per_wall  # the load average counts this run's own busy threads too
    overloaded = count_load and (load_start > cores or others_after > cores)
    starved = on_cpu and cpu_per_wall < MIN_CPU_PER_WALL
    return bool(overloaded or starved)


def assess(
    start: Reading,
    end: Reading,
    device: str,
    cores: int | None = None,
    samples: list[tuple[float, float]] | None = None,
    machine: int | None = None,
) -> dict[str, float | int | bool]:
    """The LOAD_COLUMNS of a decode that ran between the readings `start` and `end`, with a LoadSampler's
    `samples` taken meanwhile, on `cores` of the `machine`'s cores."""
    cores = usable_cores() if cores is None else cores
    machine = machine_cores() if machine is None else machine
    wall = end.wall_s - start.wall_s
    cpu_per_wall = (end.cpu_s - start.cpu_s) / wall if wall > 0 else float("nan")
    on_cpu = str(device).startswith("cpu")
    others = others_verdict(samples or [])
    pinned_and_watched = cores < machine and bool(samples)
    reliable = not (
        contended(start.load_1min, end.load_1min, cores, cpu_per_wall, on_cpu, count_load=not pinned_and_watched)
        or others.pop("others_contended")
    )
    return {
        "load_1min_start": start.load_1min,
        "load_1min_end": end.load_1min,
        "usable_cores": cores,
        "machine_cores": machine,
        "cpu_per_wall": cpu_per_wall,
        "latency_reliable": reliable,
        **others,
    }


def warning(load: dict) -> str:
    """A line for the printed table when the latencies are unreliable; empty otherwise."""
    if load.get("latency_reliable", True):
        return ""
    return (
        f"latency columns UNRELIABLE: the machine was contended while decoding (1-min load "
        f"{load['load_1min_start']:.2f} before, {load['load_1min_end']:.2f} after, on {load['usable_cores']} "
        f"usable cores; process CPU time / wall time {load['cpu_per_wall']:.2f}; other work "
        f"{load.get('others_cores_mean', np.nan):.2f} cores on average, {load.get('others_cores_peak', np.nan):.2f} "
        f"at its busiest {WINDOW_S:.0f} s). Step compression and forwards "
        "are unaffected; rerun on a quiet machine to compare latencies."
    )


def machine_busy_s() -> float:
    """CPU seconds the cores this process may run on have spent busy since boot (their /proc/stat lines: other
    work on cores it cannot use does not slow it), or NaN where unreadable."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return float("nan")
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    busy = 0
    for line in lines:
        name, *fields = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit()) or (usable is not None and int(name[3:]) not in usable):
            continue
        ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal (guest is in user)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


@dataclass
class LoadSampler:
    """Other work on the machine, in cores, every `interval` seconds while it runs (a daemon thread)."""

    interval: float = SAMPLE_INTERVAL_S
    clock: Callable[[], tuple[float, float, float]] = field(
        default=lambda: (time.perf_counter(), machine_busy_s(), time.process_time())
    )
    samples: list[tuple[float, float]] = field(default_factory=list)  # (interval's seconds, others' cores)

    def __enter__(self) -> LoadSampler:
        self._stop = threading.Event()
        self._last = self.clock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def tick(self) -> None:
        now = self.clock()
        wall, busy, own = (b - a for a, b in zip(self._last, now))
        self._last = now
        if wall > 0 and np.isfinite(busy):
            self.samples.append((wall, max(busy - own, 0.0) / wall))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.tick()  # the last part-interval


def others_verdict(samples: list[tuple[float, float]]) -> dict[str, float | int | bool]:
    """Other work's mean cores over the samples and its peak over any window of WINDOW_S seconds or more
    (the whole decode when shorter), and whether either exceeds OTHERS_LIMIT."""
    if not samples:
        return {"others_cores_mean": float("nan"), "others_cores_peak": float("nan"), "load_samples": 0,
                "others_contended": False}  # fmt: skip
    wall = np.array([w for w, _ in samples])
    busy = np.array([w * c for w, c in samples])  # other work's core-seconds per interval
    mean = float(busy.sum() / wall.sum())
    peak = mean
    for start in range(len(samples)):  # the smallest window of at least WINDOW_S from each start
        ends = np.cumsum(wall[start:])
        reach = np.searchsorted(ends, WINDOW_S)
        if reach < len(ends):
            peak = max(peak, float(busy[start : start + reach + 1].sum() / ends[reach]))
    return {"others_cores_mean": mean, "others_cores_peak": peak, "load_samples": len(samples),
            "others_contended": bool(mean > OTHERS_LIMIT or peak > OTHERS_LIMIT)}  # fmt: skip
