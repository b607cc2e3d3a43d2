"""How a page decides a latency target, and says what decided it: measured time, the cost model over its range, or
nothing (step compression is shown beside a latency target, never decisive).

A candidate's latency ratio over its references (the faster of them, where a target names several) is read from:

1. measured time, where both rows were timed on the real architecture (a non-empty `shadow` column): the
   references' measured latency over the candidate's. Its interval is the run's own paired one
   (`latency_vs_<reference>_lo/_hi`) where recorded, else each one's latency speedup interval over AR combined
   at their extremes (candidate's lower over the reference's upper, and the other way), which is wider;
2. else the cost model over its range, where both rows carry the counts it prices (sjd.harness.model_range): a
   verdict must hold at every engine and constant of the range and over the prompts;
3. else nothing decides: the rows predate the cost model.

Over its range, the model's verdict on a target is `met` where the whole range lies at or above it, `missed`
where it lies wholly below, `depends on the engine` where some engine's own range lies on one side and another's
does not, and `not distinguishable` where every engine's range includes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sjd.core.cost import ENGINES
from sjd.harness.model_range import ModelledRange, priced, ratio_range

MEASURED = "measured time"
MODELLED = "the cost model over its range"
STEPS = "steps"
RANGE_TEXT = ("the range over the cost model's engines and constants (sjd/core/cost.py: bandwidth reached, launch, "
              "eager call and sync costs) and the prompts")  # fmt: skip


@dataclass(frozen=True)
class Judged:
    """A candidate's latency ratio over its references: what measured it (`by`: MEASURED, MODELLED, or "" where
    nothing did), its value and bounds, the model's range where the model decided, and the references the run
    lacks (a ratio over the faster of several cannot be met without all of them)."""

    by: str
    point: float
    lo: float
    hi: float
    references: tuple[str, ...]
    modelled: ModelledRange | None = None
    missing: tuple[str, ...] = ()


def is_measured(row: pd.Series) -> bool:
    """A row whose latency was timed on the real architecture (its `shadow` column names it)."""
    shadow = row.get("shadow")
    return isinstance(shadow, str) and bool(shadow.strip())


def bounds(row: pd.Series, column: str) -> tuple[float, float, float]:
    value = row.get(column, np.nan)
    return float(value), float(row.get(f"{column}_lo", np.nan)), float(row.get(f"{column}_hi", np.nan))


def combined(mine: tuple[float, float, float], theirs: tuple[float, float, float]) -> tuple[float, float]:
    """The interval of mine / theirs from each one's own interval over the baseline, taken as independent: the
    half-widths of the logs added in quadrature (wider than a paired interval, which cancels what both share). A
    missing interval on the reference's side counts as none (the baseline's own ratio to itself)."""
    (v, lo, hi), (w, wlo, whi) = mine, theirs
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return np.nan, np.nan
    below = np.log(wlo / w) if np.isfinite(wlo) else 0.0
    above = np.log(whi / w) if np.isfinite(whi) else 0.0
    ratio = v / w
    return (float(ratio * np.exp(-np.hypot(np.log(v / lo), above))),
            float(ratio * np.exp(np.hypot(np.log(hi / v), below))))  # fmt: skip


def spread(candidate: pd.Series, reference: pd.Series) -> tuple[float, float]:
    """The candidate's modelled ratio over `reference` across prompts, as (lo / point, hi / point): the run's own
    paired interval where recorded (`modelled_vs_<reference>`, or `modelled_speedup` over the baseline), else the
    two rows' intervals over the baseline combined (`combined`); NaN where neither has one."""
    name = str(reference["decoder"])
    if name == candidate.get("baseline"):
        value, lo, hi = bounds(candidate, "modelled_speedup")
        return lo / value, hi / value
    value, lo, hi = bounds(candidate, f"modelled_vs_{name}")
    if np.isfinite(lo) and np.isfinite(hi):
        return lo / value, hi / value
    mine, theirs = bounds(candidate, "modelled_speedup"), bounds(reference, "modelled_speedup")
    lo, hi = combined(mine, theirs)
    return lo / (mine[0] / theirs[0]), hi / (mine[0] / theirs[0])


def measured_ratio(candidate: pd.Series, references: Sequence[pd.Series]) -> tuple[float, float, float]:
    """(point, lo, hi) of the candidate's measured latency over the faster reference (the smallest ratio)."""
    ratios = []
    for ref in references:
        name = str(ref["decoder"])
        point = float(ref["latency_s"]) / float(candidate["latency_s"])
        lo, hi = bounds(candidate, f"latency_vs_{name}")[1:]
        if not (np.isfinite(lo) and np.isfinite(hi)):
            _, clo, chi = bounds(candidate, "latency_speedup")
            _, rlo, rhi = bounds(ref, "latency_speedup")
            lo, hi = clo / rhi, chi / rlo
        ratios.append((point, lo, hi))
    return min(r[0] for r in ratios), min(r[1] for r in ratios), min(r[2] for r in ratios)


def judge(rows: pd.DataFrame, candidate: pd.Series, references: Sequence[str], scale: float = 1.0) -> Judged:
    """The candidate's latency ratio over the faster of `references` in its run's `rows` (module docstring)."""
    decoders = rows["decoder"].to_numpy()
    present = [rows.iloc[int(np.argmax(decoders == r))] for r in references if (decoders == r).any()]
    missing = tuple(r for r in references if not (decoders == r).any())
    names = tuple(references)
    if not present:
        return Judged("", np.nan, np.nan, np.nan, names, missing=missing)
    if is_measured(candidate) and all(is_measured(r) for r in present):
        point, lo, hi = measured_ratio(candidate, present)
        return Judged(MEASURED, point, lo, hi, names, missing=missing)
    if priced(candidate) and all(priced(r) for r in present):
        modelled = ratio_range(candidate, present, [spread(candidate, r) for r in present], scale)
        return Judged(MODELLED, modelled.point, modelled.lo, modelled.hi, names, modelled, missing)
    return Judged("", np.nan, np.nan, np.nan, names, missing=missing)


def side(lo: float, hi: float, target: float) -> str:
    """Where an interval stands against the target: met, missed, or open (it includes the target or is unknown)."""
    if np.isfinite(lo) and lo >= target:
        return "met"
    if np.isfinite(hi) and hi < target:
        return "missed"
    return "open"


def verdict(judged: Judged, target: float) -> str:
    """The target's verdict and what decided it (module docstring)."""
    if not judged.by:
        return ("not decided: these rows have no latency, measured or modelled (they predate the cost model; "
                "rerun the command), and step compression is not decisive")  # fmt: skip
    if judged.by == MEASURED:
        outcome = side(judged.lo, judged.hi, target)
        text = {"met": "met (the interval lies above it)", "missed": "missed (the interval lies below it)",
                "open": "not distinguishable from it at this size (the interval includes it)"}[outcome]  # fmt: skip
    else:
        text = modelled_verdict(judged.modelled, target)
    if judged.missing and text.startswith(("met", "depends", "not distinguishable")):
        text = (f"not decided: this run has no {', '.join(f'`{m}`' for m in judged.missing)} row, and the target is "
                f"read against the faster of all its references (against the others alone: {text})")  # fmt: skip
    return f"{text}; decided by {judged.by}"


def modelled_verdict(modelled: ModelledRange, target: float) -> str:
    overall = side(modelled.lo, modelled.hi, target)
    if overall == "met":
        return "met over the model's whole range (every engine and constant, and the prompts)"
    if overall == "missed":
        return "missed over the model's whole range (every engine and constant, and the prompts)"
    sides = {name: side(lo, hi, target) for name, (_, lo, hi) in modelled.engines.items()}
    if len(set(sides.values())) == 1:
        return "not distinguishable from it: the range includes it on every engine"
    words = {"met": "met", "missed": "missed", "open": "not distinguishable"}
    parts = [f"{words[s]} on {' and '.join(n for n in sides if sides[n] == s)}" for s in words if s in sides.values()]
    return f"depends on the engine ({'; '.join(parts)})"


def ratio_text(judged: Judged, fmt: str = ".2f") -> str:
    """`point [lo-hi]` with what the bracket holds, and for the model each engine's nominal value."""
    if not judged.by:
        return "no latency"
    if judged.by == MEASURED:
        return f"{judged.point:{fmt}} ({judged.lo:{fmt}}-{judged.hi:{fmt}}, measured)"
    engines = ", ".join(f"{name} {judged.modelled.engines[name][0]:{fmt}}" for name in ENGINES)
    prompts = "" if judged.modelled.over_prompts else ", constants only: the run has no interval over prompts"
    return f"{judged.point:{fmt}} [{judged.lo:{fmt}}-{judged.hi:{fmt}}{prompts}; {engines}]"


def cell(judged: Judged, fmt: str = ".2f") -> str:
    """A table cell: the value and its bracket (the range over the model) or parentheses (measured)."""
    if not judged.by:
        return ""
    if judged.by == MEASURED:
        return f"{judged.point:{fmt}} ({judged.lo:{fmt}}-{judged.hi:{fmt}})"
    return f"{judged.point:{fmt}} [{judged.lo:{fmt}}-{judged.hi:{fmt}}]"


def faster_text(judged: Judged) -> str:
    """Which reference was the faster at each engine's nominal constants, where there were several."""
    if judged.modelled is None or len(judged.references) - len(judged.missing) < 2:
        return ""
    by_reference: dict[str, list[str]] = {}
    for engine, name in judged.modelled.faster.items():
        by_reference.setdefault(name, []).append(engine)
    if len(by_reference) == 1:
        return f"the faster is `{next(iter(by_reference))}` on every engine"
    return "the faster is " + "; ".join(f"`{n}` on {' and '.join(e)}" for n, e in by_reference.items())
