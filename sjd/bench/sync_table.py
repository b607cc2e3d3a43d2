"""The table of results/syncs.csv: host syncs and operator calls per decoder iteration, for every decoder of
conf/decoder/ (or some) on each KV cache, kernel set, window and batch size, one decode of the model's first
prompts under a SyncCounter each (sjd.bench.syncs); `scripts/count_syncs.py` is its command line. Counts, not
times: the same on any machine for the same code and seeds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import torch

from sjd.bench.bookkeeping import build_model, decoder_configs, entrants, model_config, prompt_batches
from sjd.bench.syncs import count_decode, forward_op_counts, report_row, sync_purposes
from sjd.core.seeding import make_generators

SHOWN = ["decoder", "cache", "kernels", "window", "batch", "syncs_per_iter", "copies_to_device_per_iter",
         "decoder_syncs_per_iter", "pipeline_syncs_per_iter", "forward_syncs_per_iter",
         "ops_outside_forward_per_iter"]  # fmt: skip


def forward_ops_line(model: str) -> str:
    """One width-1 forward's operator calls outside the layers and per layer (what sjd.core.cost prices)."""
    adapter, _ = build_model(model)
    (group,) = prompt_batches(model, 1, 1)
    fixed, per_layer, layers = forward_op_counts(adapter, [p for p, _ in group])
    return f"{model}: {fixed} operator calls outside the layers, {per_layer} per layer ({layers} layers)"


def sync_table(
    model: str,
    names: Sequence[str] | None,
    windows: Sequence[int],
    batches: Sequence[int],
    caches: Sequence[str],
    kernels: Sequence[str],
    say: Callable[[str], None] = print,
) -> pd.DataFrame:
    """One row per (decoder, window, cache, kernels, batch): syncs, copies to the device and operator calls per
    iteration, with the decoder's sync sites and what each is for. A decoder the model cannot run is named and
    skipped; compiled kernels are counted on the static cache only (compile=true runs there)."""
    adapter, sampling = build_model(model)
    windows = [w for w in windows if w <= adapter.layout.n_tokens]
    field = []
    for name, config in decoder_configs(names).items():
        try:
            field += entrants({name: config}, adapter, windows, say, model_config(model))
        except ValueError as e:  # a setting the model cannot take (PJD's context on the toy's short rows)
            say(f"skipped {name}: {e}")
    rows = []
    for cache, kind in [(cache, kind) for kind in kernels for cache in caches]:
        if kind == "compiled" and cache != "static":
            continue
        adapter.use_cache(cache)
        for batch in batches:
            (group,) = prompt_batches(model, 1, batch)
            prompts = [p for p, _ in group]
            for e in field:
                gens = make_generators(0, [p.prompt_id for p in prompts], adapter.device)
                decode = functools.partial(e.decoder.generate, adapter, prompts, sampling, gens)
                graphs_of = e.decoder if kind == "compiled" else None
                with torch.no_grad():
                    counts = count_decode(decode, adapter, e.decoder.networks(adapter), graphs_of)
                rows.append({"decoder": e.name, "cache": cache, "kernels": kind, "window": e.window,
                             "batch": batch, **report_row([counts])})  # fmt: skip
                say(f"{e.name} {cache} cache {kind} kernels window {e.window} batch {batch}: "
                    f"{rows[-1]['syncs_per_iter']:.2f} syncs/iter, "
                    f"{rows[-1]['ops_outside_forward_per_iter']:.0f} calls/iter")  # fmt: skip
    table = pd.DataFrame(rows)
    table["decoder_sync_purposes"] = [sync_purposes(s) for s in table["decoder_sync_sites"]]
    return table.assign(model=model)


def merged_into(table: pd.DataFrame, path: Path) -> pd.DataFrame:
    """`table`'s rows added to the CSV at `path`, replacing its rows with the same decoder, cache, kernels, window
    and batch, so that counts at other windows (Hawk's 13, SSD's 5) join the reference table with their own
    command and git hash."""
    if not path.exists():
        return table
    old = pd.read_csv(path)
    replaced = set(row_keys(table))
    kept = old[[key not in replaced for key in row_keys(old)]]
    both = pd.concat([kept, table], ignore_index=True)
    order = sorted(range(len(both)), key=lambda i: row_keys(both)[i])
    return both.iloc[order].reset_index(drop=True)


def row_keys(table: pd.DataFrame) -> list[tuple]:
    """Each row's key, the same whether read back from a CSV (a window of 16.0, or none) or just counted (16, None)."""
    window = pd.to_numeric(table["window"], errors="coerce").fillna(-1.0)
    return list(zip(table["decoder"].map(str), table["cache"].map(str), table["kernels"].map(str),
                    window.astype(float), table["batch"].astype(int)))  # fmt: skip
