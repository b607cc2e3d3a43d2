"""Eager against compiled, dynamic against static cache: each decoder's latency on three engines, in one run;
`scripts/bench_engine.py` is its command line.

The engines are the run config's `cache` and `compile` (docs/evaluation.md): `eager_dynamic` (the default),
`eager_static` and `compiled_static`, each its own copy of the model. Every (decoder, engine) pair is warmed up
once per batch size first (compiling happens there; its seconds are `warmup_s`), then for each batch size and
prompt batch every decoder runs on every engine, the order alternating from round to round, one torch thread.
Per (decoder, engine, batch size): latency per image, host time per forward outside the model
(`host_ms_per_forward`), and two ratios with 95% bootstrap intervals over the prompt batches (the timing
units): the latency speedup over the same decoder on `eager_dynamic` (`vs_eager_dynamic`) and over AR on the
same engine (`vs_ar`, the harness's own speedup, which compares like engines only), and the graphs compiled
while timing (`graphs_compiled_timed`: 0 when the warm-up met every shape). Syncs per iteration are
`scripts/count_syncs.py`'s. It reports ratios measured in this run; it asserts nothing about time.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import torch

from sjd.bench.bookkeeping import build_model, decoder_configs, entrants, model_config, prompt_batches
from sjd.core.seeding import sample_generators
from sjd.harness.intervals import bootstrap_interval, latency_ratio
from sjd.harness.provenance import git_hash
from sjd.harness.results import markdown_table

ENGINES = {"eager_dynamic": ("dynamic", False), "eager_static": ("static", False), "compiled_static": ("static", True)}
SHOWN = ["decoder", "engine", "batch", "latency_s", "host_ms_per_forward", "vs_eager_dynamic", "vs_eager_dynamic_lo",
         "vs_eager_dynamic_hi", "vs_ar", "vs_ar_lo", "vs_ar_hi", "warmup_s"]  # fmt: skip


def engine_models(model: str) -> dict:
    """One adapter per engine (the same weights), and the model's sampling settings."""
    out, sampling = {}, None
    for name, (cache, compiled) in ENGINES.items():
        adapter, sampling = build_model(model)
        adapter.use_cache(cache)
        if compiled:
            adapter.compile_windows(None)  # inductor on the CPU (the run config's default compile_mode here)
        out[name] = adapter
    return out, sampling


def decode(entrant, adapter, sampling, group) -> dict:
    gens = sample_generators(0, [(p.prompt_id, k) for p, k in group], adapter.device)
    with torch.no_grad():
        result = entrant.decoder.generate(adapter, [p for p, _ in group], sampling, gens)
    forwards = sum(result.n_forward) / len(group)  # a batch's forwards are shared: per image, as the summary
    return {"latency_s": result.latency_s, "model_s": result.model_s, "forwards": max(result.n_forward),
            "tokens": result.tokens.shape[1], "forwards_per_image": forwards}  # fmt: skip


def bench_engine(
    model: str, decoders: list[str], window: int, batches: list[int], prompts: int, command: str, out: Path | None
) -> pd.DataFrame:
    """Warm up, time and summarise every (decoder, engine) pair on `model` (a conf/model/ config), printing its
    progress and the table; the table is written to `out` when one is given. `command` is recorded in each row."""
    torch.set_num_threads(1)
    engines, sampling = engine_models(model)
    any_adapter = next(iter(engines.values()))
    field = entrants(decoder_configs(decoders), any_adapter, [window], print, model_config(model))
    if not any(e.name == "ar" for e in field):
        raise ValueError("the ratios are to AR's: include ar in --decoders")

    warmup: dict[tuple[str, str], float] = {}
    for e in field:
        for engine, adapter in engines.items():
            started = time.perf_counter()
            for size in batches:  # each batch size: its own shapes to compile
                decode(e, adapter, sampling, prompt_batches(model, 1, size)[0])
            warmup[(e.name, engine)] = time.perf_counter() - started
            print(f"warmed up {e.name} on {engine}: {warmup[(e.name, engine)]:.1f} s")

    from torch._dynamo.utils import counters

    graphs_before, records, round_no = counters["stats"]["unique_graphs"], [], 0
    for size in batches:
        for unit, group in enumerate(prompt_batches(model, prompts, size)):
            pairs = [(e, engine) for e in field for engine in engines]
            for e, engine in pairs if round_no % 2 == 0 else pairs[::-1]:
                records.append({"decoder": e.name, "engine": engine, "batch": size, "unit": unit,
                                **decode(e, engines[engine], sampling, group)})  # fmt: skip
            round_no += 1
            print(f"round {round_no}: batch {size} done")
    table = summarise(pd.DataFrame(records), warmup)
    timed = counters["stats"]["unique_graphs"] - graphs_before  # compiled after the warm-up: 0 unless it missed a shape
    print(f"graphs compiled while timing: {timed}")
    table = table.assign(graphs_compiled_timed=timed, model=model, window=window, prompts=prompts, command=command,
                         git_hash=git_hash(), torch=torch.__version__)  # fmt: skip
    print(markdown_table(table[SHOWN].round(3)))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out, index=False)
        print(f"wrote {out}")
    return table


def summarise(records: pd.DataFrame, warmup: dict[tuple[str, str], float]) -> pd.DataFrame:
    """One row per (decoder, engine, batch size); ratios over the prompt batches, paired by unit."""

    def units(decoder: str, engine: str, batch: int) -> pd.DataFrame:
        rows = records[(records.decoder == decoder) & (records.engine == engine) & (records.batch == batch)]
        return rows.sort_values("unit")

    out = []
    for (decoder, engine, batch), rows in records.groupby(["decoder", "engine", "batch"], sort=False):
        rows = rows.sort_values("unit")
        latency = rows.latency_s.to_numpy()
        host = (rows.latency_s - rows.model_s).to_numpy() / rows.forwards.to_numpy()
        row = {"decoder": decoder, "engine": engine, "batch": batch, "latency_s": float(latency.mean() / batch),
               "host_ms_per_forward": float(1000 * host.mean()),
               "forwards_per_image": float(rows.forwards_per_image.mean()),
               "warmup_s": round(warmup[(decoder, engine)], 2)}  # fmt: skip
        for name, base in (("vs_eager_dynamic", units(decoder, "eager_dynamic", batch)),
                           ("vs_ar", units("ar", engine, batch))):  # fmt: skip
            b = base.latency_s.to_numpy()
            row[name] = float(latency_ratio(b, latency))
            row[f"{name}_lo"], row[f"{name}_hi"] = bootstrap_interval(latency_ratio, [b, latency])
        out.append(row)
    return pd.DataFrame(out)
