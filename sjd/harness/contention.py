"""Whether a run's latencies can be trusted: what else loaded the machine while it decoded.

Two readings bracket the decode (`sample` before, `sample` after, `assess` on the pair):
the 1-minute load average (os.getloadavg: runnable threads, machine-wide) and the process's CPU
time (time.process_time, every thread of this process) against the wall time between them.

The rule (`contended`): latencies are unreliable when either
- other work outnumbered the cores this run may use (os.sched_getaffinity, else os.cpu_count):
  the load before decoding, or the load after it less the cores this run kept busy (its CPU time
  over wall time), exceeds those cores; or
- on a CPU device, the process ran less than MIN_CPU_PER_WALL of the wall time on a core: its
  threads waited for one. (A GPU run's CPU thread may sleep on the device, so there only the load counts.)

A contended run slows AR's many one-token forwards far more than a parallel decoder's few wide
ones, which inflates the latency speedup; step compression and forward counts are unaffected.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

MIN_CPU_PER_WALL = 0.5
LOAD_COLUMNS = ("load_1min_start", "load_1min_end", "usable_cores", "cpu_per_wall", "latency_reliable")


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


def contended(load_start: float, load_end: float, cores: int, cpu_per_wall: float, on_cpu: bool) -> bool:
    """The rule of the module docstring. An unknown load (NaN) does not count as contention."""
    others_after = load_end - cpu_per_wall  # the load average counts this run's own busy threads too
    overloaded = load_start > cores or others_after > cores
    starved = on_cpu and cpu_per_wall < MIN_CPU_PER_WALL
    return bool(overloaded or starved)


def assess(start: Reading, end: Reading, device: str, cores: int | None = None) -> dict[str, float | int | bool]:
    """The LOAD_COLUMNS of a decode that ran between the readings `start` and `end`."""
    cores = usable_cores() if cores is None else cores
    wall = end.wall_s - start.wall_s
    cpu_per_wall = (end.cpu_s - start.cpu_s) / wall if wall > 0 else float("nan")
    on_cpu = str(device).startswith("cpu")
    reliable = not contended(start.load_1min, end.load_1min, cores, cpu_per_wall, on_cpu)
    return {
        "load_1min_start": start.load_1min,
        "load_1min_end": end.load_1min,
        "usable_cores": cores,
        "cpu_per_wall": cpu_per_wall,
        "latency_reliable": reliable,
    }


def warning(load: dict) -> str:
    """A line for the printed table when the latencies are unreliable; empty otherwise."""
    if load.get("latency_reliable", True):
        return ""
    return (
        f"latency columns UNRELIABLE: the machine was contended while decoding (1-min load "
        f"{load['load_1min_start']:.2f} before, {load['load_1min_end']:.2f} after, on {load['usable_cores']} "
        f"usable cores; process CPU time / wall time {load['cpu_per_wall']:.2f}). Step compression and forwards "
        "are unaffected; rerun on a quiet machine to compare latencies."
    )
