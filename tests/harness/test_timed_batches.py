"""Every study command whose page shows latency intervals times at least MIN_TIMED_BATCHES batches: a latency
interval resamples timed batches (prompts x seeds per prompt over batch_size), and with fewer the bootstrap is
degenerate. The commands below it list smaller sizes on purpose, each with its reason."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from sjd.harness.prompts import load_prompt_set
from sjd.harness.runner import seeds_per_prompt

ROOT = Path(__file__).resolve().parents[2]
MIN_TIMED_BATCHES = 4
COST_768 = "the 768 px stand-in's runs take hours on 2 cores: a few prompts, the page shows no latency interval"
FEWER = {
    "python run.py experiment=audit_controls model=standin_lumina_512 prompts=standin prompts.n=16 seeds_per_prompt=1 "
    "batch_size=8 audit.n=8 audit.batch_size=8": "a negative control's audit, whose latency is not its point",
    "python run.py experiment=audit_controls decoder.window=64 prompts.n=4 audit.n=100": "likewise",
    "python run.py experiment=audit_controls model=standin_lumina_512 prompts=standin prompts.n=4 seeds_per_prompt=1 "
    "batch_size=4 audit.n=4 audit.batch_size=4": "likewise",
    "python run.py experiment=beyond_sjd_pac model=standin_lumina_768_cal prompts.n=8": COST_768,
    "python run.py experiment=heads_siblings model=standin_lumina_768_cal prompts.n=8 "
    "+model.heads=sjd/assets/spatial_heads_standin_lumina_768_cal": "decided on modelled latency, whose unit is the "
    "prompt, as its 512 px run is; eight prompts, as beyond_sjd_pac's 768 px run",
    "python run.py experiment=heads_tokens model=standin_lumina_768_cal prompts.n=8 "
    "+model.heads=sjd/assets/spatial_heads_standin_lumina_768_cal": "as heads_siblings' 768 px run, on the same "
    "prompts",
    "python run.py experiment=ssd_readings": "its readings are judged on modelled speedup (counted) and the "
    "one-sample audit, not measured latency; eight prompts keep its eight readings within a shared CPU's time",
    "python run.py experiment=cost_validation": "its page shows modelled figures, whose unit is the prompt, and no "
    "measured latency",
    "python run.py experiment=regime_drafters model=standin_lumina_768_cal decoder.window=16 prompts.n=4": COST_768,
    "python run.py experiment=regime_drafters model=standin_lumina_768_cal decoder.window=64 prompts.n=4": COST_768,
    "python run.py experiment=regime_map model=standin_lumina_768 decoder.window=16 prompts.n=2 audit.n=4": COST_768,
    "python run.py experiment=regime_map model=standin_lumina_768 decoder.window=64 prompts.n=2 audit.n=0": COST_768,
    "python run.py experiment=regime_variants model=standin_lumina_768 decoder.window=16 prompts.n=4": COST_768,
    "python run.py experiment=regime_variants model=standin_lumina_768 decoder.window=64 prompts.n=4": COST_768,
    "python run.py experiment=toy_coupled decoder.window=64 prompts.n=2 audit.n=0": "two prompts: step compression",
    "python run.py experiment=toy_lossy prompts.n=2 audit.n=0": "two prompts: step compression and distance only",
    "python run.py experiment=toy_throughput batch_size=4 prompts.n=8": "throughput at one batch size on the same 8 "
    "prompts as batch 1: the batch is the variable",
    "python run.py experiment=toy_throughput batch_size=8 prompts.n=8": "likewise",
}


def shows_latency_intervals(page: str) -> bool:
    """Whether the study's CSV carries latency intervals (its page then shows them); a study not run yet will."""
    csv = ROOT / "results" / "studies" / f"{page}.csv"
    return not csv.exists() or "latency_speedup_lo" in pd.read_csv(csv, nrows=1).columns


STUDY_COMMANDS = [
    (path.stem, command)
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml"))
    if (study := OmegaConf.load(path).get("study")) and shows_latency_intervals(study.page)
    for command in study.get("commands", [])
]


def timed_batches(cfg) -> int:
    p = cfg.prompts
    chosen = {k: p.get(k) for k in ("n", "subset_seed", "delimiter", "quoting", "skip") if p.get(k) is not None}
    prompts = load_prompt_set(p.name, p.path, **chosen).prompts
    return math.ceil(len(prompts) * seeds_per_prompt(cfg) / cfg.batch_size)


@pytest.mark.parametrize("experiment, command", STUDY_COMMANDS, ids=[c for _, c in STUDY_COMMANDS])
def test_each_study_command_times_enough_batches_for_a_latency_interval(compose_cfg, experiment, command):
    n = timed_batches(compose_cfg(command.split()[2:]))
    if command in FEWER:
        assert n < MIN_TIMED_BATCHES, f"{command} now times {n} batches: take it off FEWER"
        return
    assert n >= MIN_TIMED_BATCHES, (
        f"{command} times {n} batch(es) (< {MIN_TIMED_BATCHES}): raise prompts.n or lower batch_size in "
        f"conf/experiment/{experiment}.yaml, or list it in FEWER with its reason"
    )


def test_the_exceptions_are_listed_study_commands():
    assert set(FEWER) <= {c for _, c in STUDY_COMMANDS}
