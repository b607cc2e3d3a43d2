"""A modelled ratio over the plausible range of the cost model's constants, not only over prompts.

A modelled latency is the cost model's (sjd.core.cost) price of a summary row's recorded counts: its forwards, their
mean width and context, its drafter forwards, the decoder's calls and syncs per iteration. Its constants are not
known exactly: the engine (eager, compiled as measured, graphed), the share of the datasheet bandwidth reached, a
launch's, an eager call's and a sync's cost. `ratio_range` prices both rows at every corner of that range
(sjd.core.cost.corners) and returns the ratio's nominal value per engine and its range:

- at each corner, the ratio is the reference's modelled time over the candidate's (times `scale`); against
  several references, the smallest of those ratios: the candidate over the faster reference at that corner;
- its spread over prompts is carried over from the run's own interval at the default engine (`spreads`: each
  bound over the point), so a corner's interval is its ratio times that spread. What varies from prompt to prompt
  is mostly how many forwards a decoder needs, which no constant changes;
- the range is the lowest corner's lower bound to the highest corner's upper bound, overall and per engine.

The compiled engine pays a decoder's calls as results/syncs.csv counted them compiled (static cache) where its
class was counted so; every other engine pays the calls the run recorded. Counting is done once per decoder config
on the toy model (scripts/count_syncs.py), not on the run's own model and batch; a wrong count moves every engine
alike, which the call costs' range only partly covers.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sjd.core.cost import DEFAULT_ENGINE, DEFAULT_GPU, ENGINES, GPUS, Corner, corners
from sjd.harness.pricing import cfg_rows, decoder_overheads, modelled_seconds


@dataclass(frozen=True)
class ModelledRange:
    """A modelled ratio: its value at the default engine's nominal constants (`point`), its range over every corner
    and the prompts (`lo`, `hi`), per engine its nominal value and range (`engines`), per engine the reference that
    was the faster at nominal constants (`faster`), and whether the range carries a spread over prompts."""

    point: float
    lo: float
    hi: float
    engines: dict[str, tuple[float, float, float]]
    faster: dict[str, str]
    over_prompts: bool


def priced(row: pd.Series) -> bool:
    """Whether a summary row carries what the cost model prices (rows from before it do not)."""
    needed = ("prices_as", "priced_context", "priced_width", "decoder_ops_per_iter", "syncs_per_iter", "sampling")
    return all(c in row and not (isinstance(row[c], float) and np.isnan(row[c])) for c in needed)


@functools.cache
def compiled_calls(cls: str, settings: str) -> tuple[float, float]:
    """(calls, syncs) per iteration of a decoder class with these settings (JSON) as counted compiled."""
    return decoder_overheads(cls, json.loads(settings), "static", compiled=True)


def with_engine_calls(row: pd.Series, corner: Corner) -> pd.Series:
    """The row with the calls and syncs per iteration `corner`'s engine pays: for the compiled engine, the compiled
    count of its decoder's config where there is one (a run compiled already recorded it)."""
    if corner.engine.kernels != "compiled" or bool(row.get("compiled", False)):
        return row
    classes, configs = json.loads(row["decoder_classes"]), json.loads(row["decoder_configs"])
    cls = classes.get(row["decoder"], "")
    calls, syncs = compiled_calls(cls, json.dumps(configs.get(row["decoder"], {}), sort_keys=True))
    if np.isnan(calls):
        return row
    out = row.copy()
    out["decoder_ops_per_iter"], out["syncs_per_iter"] = calls, syncs
    return out


def corner_seconds(row: pd.Series, corner: Corner) -> float:
    """One image's modelled seconds for a summary row at `corner`, its calls as given (with_engine_calls)."""
    return modelled_seconds(row, row["prices_as"], cfg_rows({"sampling": row["sampling"]}), corner.gpu, corner.engine)


def ratio_range(
    candidate: pd.Series,
    references: Sequence[pd.Series],
    spreads: Sequence[tuple[float, float]],
    scale: float = 1.0,
    gpu: str = DEFAULT_GPU,
) -> ModelledRange:
    """The candidate's modelled ratio over the faster of `references` at every corner (module docstring): each
    reference's modelled time over the candidate's, times `scale`; `spreads` holds each reference ratio's interval
    over prompts as (lo / point, hi / point), NaN where the run has none (the range is then over constants only)."""
    over_prompts = all(np.isfinite(s[0]) and np.isfinite(s[1]) for s in spreads)
    spreads = [s if over_prompts else (1.0, 1.0) for s in spreads]
    names = [str(r["decoder"]) for r in references]
    engines, faster = {}, {}
    for name in ENGINES:
        at_nominal = Corner(ENGINES[name], GPUS[gpu])
        # each row with the calls this engine pays, once for all its corners
        candidate_e = with_engine_calls(candidate, at_nominal)
        references_e = [with_engine_calls(r, at_nominal) for r in references]
        mine = corner_seconds(candidate_e, at_nominal)
        nominal = [corner_seconds(r, at_nominal) / mine * scale for r in references_e]
        los, his = [], []
        for corner in corners(GPUS[gpu], [name]):
            mine = corner_seconds(candidate_e, corner)
            ratios = [corner_seconds(r, corner) / mine * scale for r in references_e]
            los.append(min(r * lo for r, (lo, _) in zip(ratios, spreads)))
            his.append(min(r * hi for r, (_, hi) in zip(ratios, spreads)))
        engines[name] = (min(nominal), min(los), max(his))
        faster[name] = names[int(np.argmin(nominal))]
    lo, hi = min(v[1] for v in engines.values()), max(v[2] for v in engines.values())
    return ModelledRange(engines[DEFAULT_ENGINE][0], lo, hi, engines, faster, over_prompts)
