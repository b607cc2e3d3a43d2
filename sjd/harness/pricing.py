"""What a GPU would pay for each sample of a run: its forwards priced at the real size the model stands for.

Each sample's counts (the tokens every target forward committed, so every forward's context; its window inputs;
its drafter forwards) are priced by sjd.core.cost at the architecture `model.prices_as` names, at batch 1 with the
run's CFG rows, on a GPU and an engine. The decoder's own operator calls and host syncs per iteration are not
counted in the run (counting them slows every call): they come from results/syncs.csv, which
`scripts/count_syncs.py` counted once per decoder config, cache, window and kernels (eager, or compiled as
compile=true runs them: sjd.decoders.kernels). A run's decoder is matched to the counted config of its class whose
settings agree with it most, at the nearest window, with its run's kernels where those were counted.

Per sample: `priced_forwards` (target forwards plus drafter forwards at the drafter's byte ratio, and draft-head
calls at the heads' byte ratio), the counts a GPU
pays for (mean context and width of the target forwards, the decoder's calls and syncs per iteration) and `modelled_s`
(seconds on DEFAULT_GPU under DEFAULT_ENGINE, `graphed`) and `modelled_eager_s` (the same GPU, eager). The summary
keeps the counts, so a page can price a row on any GPU and engine of sjd.core.cost (`modelled_seconds`). All are NaN
where the model names no real architecture (the toy and micro models); `modelled_s` is NaN for a decoder never
counted.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from sjd.core.cost import (
    ARCHITECTURES,
    DEFAULT_ENGINE,
    DEFAULT_GPU,
    ENGINES,
    GPU,
    GPUS,
    DecodeCounts,
    Engine,
    decode_seconds,
    draft_head_rows,
    drafter_price,
    eagle_drafter,
    heads_price,
    mean_context,
)

SYNCS_CSV = Path(__file__).resolve().parents[2] / "results" / "syncs.csv"
SYNC_COLUMNS = ("decoder_syncs_per_iter", "pipeline_syncs_per_iter", "forward_syncs_per_iter")


@functools.cache
def counted_overheads(path: Path = SYNCS_CSV) -> pd.DataFrame:
    """results/syncs.csv at batch 1, with each counted config's class and composed settings."""
    from sjd.harness.decoder_configs import decoder_config

    if not path.is_file():
        return pd.DataFrame(columns=["decoder", "cls", "cache", "kernels", "window", "ops", "syncs", "settings"])
    table = pd.read_csv(path)
    table = table[table["batch"] == 1].copy()
    table["kernels"] = table["kernels"].fillna("eager") if "kernels" in table else "eager"  # rows counted before
    configs = {name: decoder_config(name) for name in table["decoder"].unique()}
    table["cls"] = table["decoder"].map(lambda n: str(configs[n]["_target_"]).rsplit(".", 1)[-1])
    table["settings"] = table["decoder"].map(lambda n: {k: str(v) for k, v in configs[n].items()})
    table["ops"] = table["ops_outside_forward_per_iter"]
    table["syncs"] = table[list(SYNC_COLUMNS)].sum(axis=1)
    return table[["decoder", "cls", "cache", "kernels", "window", "ops", "syncs", "settings"]].reset_index(drop=True)


def decoder_overheads(
    cls: str, settings: dict, cache: str, table: pd.DataFrame | None = None, compiled: bool = False
) -> tuple[float, float]:
    """(operator calls, host syncs) per iteration for a decoder of class `cls` with `settings` on `cache`: the
    counted config of that class whose settings agree with these most, at the window nearest this one (the
    dynamic cache's count where the cache was not counted), counted with compiled kernels for a `compiled` run
    where they were (else eager, which prices more launches than it would pay); (NaN, NaN) for a class never
    counted."""
    table = counted_overheads() if table is None else table
    rows = table[table["cls"] == cls]
    if rows.empty:
        return float("nan"), float("nan")
    kernels = "compiled" if compiled and (rows["kernels"] == "compiled").any() else "eager"
    rows = rows[rows["kernels"] == kernels]
    if cache in set(rows["cache"]):
        rows = rows[rows["cache"] == cache]
    else:
        rows = rows[rows["cache"] == "dynamic"]
    mine = {k: str(v) for k, v in settings.items()}
    agreement = rows["settings"].map(lambda theirs: sum(mine.get(k) == v for k, v in theirs.items()))
    rows = rows[agreement == agreement.max()]
    window = settings.get("window")
    if window is not None and rows["window"].notna().any():
        rows = rows.iloc[[int(np.nanargmin((rows["window"] - float(window)).abs().to_numpy()))]]
    best = rows.iloc[0]
    return float(best["ops"]), float(best["syncs"])


def cfg_rows(meta: dict) -> int:
    """Cache rows of one image: 2 with classifier-free guidance (a scale other than 1), else 1."""
    sampling = meta.get("sampling") or {}
    if isinstance(sampling, str):  # a summary row holds it as JSON
        sampling = json.loads(sampling)
    return 2 if float(sampling.get("cfg_scale", 1.0)) != 1.0 else 1


COUNT_COLUMNS = ["priced_forwards", "priced_context", "priced_width", "decoder_ops_per_iter", "syncs_per_iter",
                 "draft_head_rows"]  # fmt: skip


# The modelled seconds every sample gets, by column: the default engine's, and eager's (as the published code runs).
MODELLED = {"modelled_s": DEFAULT_ENGINE, "modelled_eager_s": "eager"}


def sample_prices(samples: pd.DataFrame, meta: dict, gpu: str = DEFAULT_GPU) -> pd.DataFrame:
    """Per sample (same index): `priced_forwards`, the counts a GPU pays for (`priced_context`, `priced_width`,
    `decoder_ops_per_iter`, `syncs_per_iter`, and `draft_head_rows`: the LM head rows its drafter or heads compute,
    by their `head` setting) and the MODELLED seconds on `gpu`; NaN where the model names no real architecture."""
    out = pd.DataFrame(np.nan, index=samples.index, columns=[*COUNT_COLUMNS, *MODELLED])
    name = meta.get("prices_as")
    if name is None or name not in ARCHITECTURES:
        return out
    extras = samples["extras"] if "extras" in samples else pd.Series([{}] * len(samples), index=samples.index)
    extras = extras.map(lambda e: e if isinstance(e, dict) else {})
    drafted = extras.map(lambda e: float(e.get("drafter_forwards", 0.0)))
    head_calls = extras.map(lambda e: float(e.get("head_forwards", 0.0)))
    heads = extras.map(lambda e: int(e.get("heads", 0)))
    classes, configs = meta.get("decoder_classes") or {}, meta.get("decoder_configs") or {}
    head = samples["decoder"].map(lambda d: draft_head(configs.get(d, {})))
    target = ARCHITECTURES[name]
    out["draft_head_rows"] = head.map(lambda h: draft_head_rows(target, h)).astype(float)
    heads_cost = head_calls * [heads_price(name, k, h) if k else 0.0 for k, h in zip(heads, head)]
    drafter_cost = drafted * [drafter_price(name, h) for h in head]
    out["priced_forwards"] = samples["n_forward"].astype(float) + drafter_cost + heads_cost
    out["priced_context"] = samples["accepted"].map(mean_context)
    inputs = extras.map(lambda e: e.get("window_inputs", np.nan)).astype(float)
    out["priced_width"] = (inputs / samples["n_forward"]).fillna(1.0).clip(lower=1.0)
    cache = meta.get("cache") or "dynamic"
    for decoder in samples["decoder"].unique():
        ops, syncs = decoder_overheads(
            classes.get(decoder, ""), configs.get(decoder, {}), cache, compiled=bool(meta.get("compiled"))
        )
        mine = samples["decoder"] == decoder
        out.loc[mine, "decoder_ops_per_iter"], out.loc[mine, "syncs_per_iter"] = ops, syncs
    counts = out.assign(drafter_forwards=drafted, head_forwards=head_calls, heads=heads,
                        forwards=samples["n_forward"].astype(float))  # fmt: skip
    for column, engine in MODELLED.items():
        out[column] = [modelled_seconds(row, name, cfg_rows(meta), gpu, engine) for _, row in counts.iterrows()]
    return out


def draft_head(config: dict) -> str:
    """The LM head a decoder's drafter or heads run, from its config (`full` for rows recorded before the setting,
    which every drafter then ran)."""
    part = config.get("drafter") or config.get("heads") or {}
    return str(part.get("head", "full")) if isinstance(part, dict) else "full"


def modelled_seconds(
    row: pd.Series, prices_as: str, rows: int, gpu: str | GPU = DEFAULT_GPU, engine: str | Engine = DEFAULT_ENGINE
) -> float:
    """One image's modelled decode seconds from a sample's or a summary row's counts (`forwards` or `n_forward`,
    the COUNT_COLUMNS, `drafter_forwards` and, for draft heads, `head_forwards` and `heads`), priced as
    `prices_as` on `gpu` under `engine` (names in sjd.core.cost, or a corner's own: sjd.harness.model_range). A
    row without `draft_head_rows` drafts with the full LM head."""
    gpu = GPUS[gpu] if isinstance(gpu, str) else gpu
    engine = ENGINES[engine] if isinstance(engine, str) else engine
    target = ARCHITECTURES[prices_as]
    rows_kept = row.get("draft_head_rows", np.nan)
    head_rows = None if pd.isna(rows_kept) else int(rows_kept)
    drafted = row.get("drafter_forwards", 0.0)
    head_calls, heads = row.get("head_forwards", 0.0), row.get("heads", 0)
    head_calls = 0.0 if pd.isna(head_calls) else float(head_calls)
    counts = DecodeCounts(
        forwards=float(row["forwards"] if "forwards" in row else row["n_forward"]),
        context=float(row["priced_context"]),
        width=float(row["priced_width"]),
        drafter_forwards=0.0 if pd.isna(drafted) else float(drafted),
        head_forwards=head_calls,
        heads=int(heads) if head_calls else 0,
        decoder_ops=float(row["decoder_ops_per_iter"]),
        syncs=float(row["syncs_per_iter"]),
        draft_head_rows=head_rows,
    )
    return decode_seconds(counts, target, gpu, engine, rows, eagle_drafter(target, head_rows))
