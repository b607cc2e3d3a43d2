"""The markdown pieces of a results page: a run's key table and its provenance line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

# rows_below and rounds: what tells SSD's readings apart (studies.readings_page)
SETTINGS = ("init", "context", "denoise_steps", "coupling", "forced_drafts", "verification", "neighbours",
            "delta", "branches", "branch_depth", "ar_prefix", "schedule", "official_l",
            "rows_below", "rounds")  # fmt: skip
# (column, heading, format): the key columns, each shown where a row of the part has a value.
COLUMNS = (
    ("n_prompts", "samples", "d"),
    ("n_forward", "forwards per image", ".1f"),
    ("step_compression", "step compression", ".2f"),
    ("inputs_per_token", "inputs per token", ".2f"),
    ("latency_speedup", "latency speedup", ".2f"),
    ("efficiency", "efficiency", ".2f"),
    ("fe_compression", "fe compression", ".2f"),  # drafter forwards priced at their bytes (sjd.core.cost)
    ("modelled_speedup", "modelled speedup", ".2f"),  # on an H100, forwards graphed (sjd.harness.pricing)
    ("outside_model_frac", "outside model", ".1%"),
    ("fid", "FID", ".1f"),
    ("clip", "CLIP", ".1f"),
    ("audit_tv", "audit TV", ".3f"),
    ("audit_p", "audit p", ".3g"),
    # the one-sample teacher-forced audit of the run's own samples (audit.teacher_forced)
    ("tf_n_tokens", "tokens audited", "d"),
    ("tf_tokens_needed", "tokens needed", ".0f"),  # for power against a 0.01 nats/token excess
    ("tf_tokens_needed_split", "tokens needed (split)", ".0f"),  # against +-0.01 split by entropy or image band
    ("tf_excess_nats", "excess nats/token", ".4f"),
    ("tf_ks_d", "KS D", ".3f"),
    ("tf_zero_share", "impossible tokens", ".2%"),
    ("tf_p", "one-sample p", ".3g"),
    ("tf_verdict", "one-sample verdict", "s"),
)


# Ratio columns printed with their 95% interval beside them: column -> the columns of its interval.
INTERVALS = {
    c: (f"{c}_lo", f"{c}_hi")
    for c in ("step_compression", "latency_speedup", "efficiency", "fe_compression", "modelled_speedup")
}
NO_INTERVAL = "n/a: rerun"  # a row written before runs recorded intervals
NO_HASH = "n/a: no hash"  # a row written before runs hashed the networks they loaded (`weights_sha`)
ONE_PROMPT = "n/a: one prompt"  # a run of one prompt (its seeds are one unit): no spread over prompts to measure
ONE_BATCH = "n/a: one timed batch"  # a latency ratio of a run timed in one batch: no spread of timings to measure
# Ratios whose interval resamples timed batches (`latency_units` of them), not prompts.
TIMED = ("latency_speedup", "efficiency")
INTERVAL_LEGEND = (
    "A ratio's parentheses hold its 95% interval (a paired bootstrap against the decoder it is a ratio to, "
    "docs/evaluation.md): over prompts, and for latency speedup and efficiency over timed batches; "
    f"`{NO_INTERVAL}` marks rows written before runs recorded intervals (for latency, batched runs from before "
    f"they were over timed batches), `{ONE_PROMPT}` a run of a single prompt, `{ONE_BATCH}` a run timed in one batch."
)


def latest_run(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the last run among `rows` (the results CSV is appended to in run order)."""
    return rows[rows["run_dir"] == rows["run_dir"].iloc[-1]]


def latest_runs(results: pd.DataFrame, commands: list[str]) -> list[pd.DataFrame]:
    """The rows of each listed command's latest run, in the listed order; commands without rows are left out."""
    recorded = results["command"] if "command" in results else pd.Series([None] * len(results), index=results.index)
    return [latest_run(results[recorded == c]) for c in commands if (recorded == c).any()]


def varying_settings(configs: list[dict]) -> list[str]:
    """The SETTINGS keys whose values differ between these decoders (what tells them apart)."""
    missing = object()
    return [k for k in SETTINGS if len({repr(c.get(k, missing)) for c in configs}) > 1]


def settings_of(config: dict, keys: list[str]) -> str:
    described = ", ".join(f"{k}={config[k]}" for k in keys if k in config)
    return described or "-"


def accepted_length_shares(accept_hist: str) -> tuple[float, float]:
    """Share of forwards that commit one token, and share of tokens committed by forwards of more than 40."""
    hist = {int(k): v for k, v in json.loads(accept_hist).items()}
    tokens = sum(k * v for k, v in hist.items())
    return hist.get(1, 0) / sum(hist.values()), sum(k * v for k, v in hist.items() if k > 40) / tokens


def cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if fmt == "d":
        return str(int(value))
    if fmt == "s":
        return str(value)
    return format(float(value), fmt)


def with_interval(
    value, lo, hi, fmt: str, n_units: float | None = None, unit: str = "", too_few: str = ONE_PROMPT
) -> str:
    """`value (lo-hi)`; `value (n/a: ...)` when the interval is unknown: fewer than two units (prompts, or
    timed batches: `too_few` says which) have none, and a row without one was written before runs recorded
    intervals."""
    shown = cell(value, fmt)
    if not shown:
        return shown
    shown += unit
    if cell(lo, fmt) and cell(hi, fmt):
        return f"{shown} ({cell(lo, fmt)}-{cell(hi, fmt)})"
    reason = too_few if n_units is not None and not pd.isna(n_units) and n_units < 2 else NO_INTERVAL
    return f"{shown} ({reason})"


def interval_cells(
    rows: pd.DataFrame, column: str, lo: str, hi: str, fmt: str, reference: str | tuple[str, ...] | None, unit: str = ""
) -> list[str]:
    """A ratio column with its interval beside each value; the reference row (a ratio to itself; `reference` may
    name several, each its own run's) bare."""
    references = tuple(reference) if isinstance(reference, tuple | list) else (reference,)
    missing = pd.Series([float("nan")] * len(rows), index=rows.index)
    los, his = rows[lo] if lo in rows else missing, rows[hi] if hi in rows else missing
    units = rows["n_captions"] if "n_captions" in rows else missing  # older rows lack it: NO_INTERVAL
    too_few = ONE_PROMPT
    if column in TIMED:  # over timed batches; older rows' latency intervals, over prompts, are shown only where
        # each prompt was timed alone (batch_size 1), the one case in which a prompt was a timing unit
        alone = units.where(rows["batch_size"] == 1) if "batch_size" in rows else missing
        units = rows["latency_units"].fillna(alone) if "latency_units" in rows else alone
        los, his, too_few = los.where(units.notna()), his.where(units.notna()), ONE_BATCH
    return [
        cell(v, fmt) + unit if d in references else with_interval(v, a, b, fmt, n, unit, too_few)
        for d, v, a, b, n in zip(rows["decoder"], rows[column], los, his, units)
    ]


def key_table(rows: pd.DataFrame, figure: str | None) -> pd.DataFrame:
    """The part's table: decoder, window, the settings that tell its decoders apart, then every key
    column some row has, step compression over SJD's when the run has a decoder named sjd, and for an
    accept_hist study the shares of short and long accepted lengths."""
    configs = json.loads(rows["decoder_configs"].iloc[0])
    per_row = [configs.get(d, {}) for d in rows["decoder"]]
    baseline = rows["baseline"].iloc[0] if "baseline" in rows else None
    keys = varying_settings([c for d, c in zip(rows["decoder"], per_row) if d != baseline])
    table = pd.DataFrame(
        {
            "decoder": rows["decoder"].tolist(),
            "window": [str(c.get("window", "")) for c in per_row],
            "settings": [settings_of(c, keys) for c in per_row],
        }
    )
    for column, heading, fmt in COLUMNS:
        if column in rows and rows[column].notna().any():
            if column in INTERVALS:
                table[heading] = interval_cells(rows, column, *INTERVALS[column], fmt, baseline)
            else:
                table[heading] = [cell(v, fmt) for v in rows[column]]
        if column == "step_compression" and "sjd" in set(rows["decoder"]):
            sjd = float(rows.loc[rows["decoder"] == "sjd", "step_compression"].iloc[0])
            ratios = rows.assign(vs_sjd=rows["step_compression"] / sjd)
            table["vs sjd"] = interval_cells(ratios, "vs_sjd", "vs_sjd_lo", "vs_sjd_hi", ".2f", "sjd")
    if figure == "accept_hist":
        shares = [accepted_length_shares(h) for h in rows["accept_hist"]]
        table["forwards committing 1 token"] = [cell(one, ".0%") for one, _ in shares]
        table["tokens from forwards committing > 40"] = [cell(long, ".0%") for _, long in shares]
    return table


def markdown(table: pd.DataFrame) -> str:
    head = "| " + " | ".join(table.columns) + " |"
    text = (
        "decoder",
        "reading",
        "settings",
        "model",
        "anchor",
        "schedule",
        "overrides",
        "recipe",
        "calibrated",
        "seeds",
        "smallest_at",
    )
    rule = "| " + " | ".join("---" if c in text else "---:" for c in table.columns) + " |"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def describe_run(rows: pd.DataFrame) -> str:
    def values(column: str) -> str:
        found = [str(v) for v in dict.fromkeys(rows[column].dropna())] if column in rows else []
        return ", ".join(f"`{v}`" for v in found) or "not recorded"

    first = rows.iloc[0]
    seeds = int(first["seeds_per_prompt"]) if "seeds_per_prompt" in rows and pd.notna(first["seeds_per_prompt"]) else 1
    parts = [
        f"git {values('git_hash')}",
        f"config fingerprint {values('config_fingerprint')}",
        f"model `{first['model']}`",
        f"prompts `{first['prompt_set']}` ({first['prompt_selection']}), {seeds} seed(s) each",
        f"batch size {first['batch_size']}",
        f"device `{first['device']}`",
        weights_text(rows),
    ]
    parts.append(machine_load(rows))
    parts.append(wall_time(rows))
    if "audit_noise_tv" in rows and rows["audit_noise_tv"].notna().any():
        parts.append(
            f"audit: {int(first['audit_n'])} samples of one caption per decoder against AR's; AR against AR "
            f"(noise floor of audit TV) {first['audit_noise_tv']:.3f}"
        )
    return "; ".join(parts) + "."


def weights_text(rows: pd.DataFrame) -> str:
    """The sha256 prefixes of the networks the run loaded (`weights_sha`: the model's and each decoder's own, a
    hash with the names that loaded it), or NO_HASH for rows written before runs hashed them."""
    loaded: dict[str, list[str]] = {}
    for value in rows["weights_sha"].dropna() if "weights_sha" in rows else []:
        record = json.loads(value)
        for name, sha in sorted(record.items(), key=lambda item: item[0] != "model"):  # the model's first
            names = loaded.setdefault(sha, [])
            names += [name] if name not in names else []
    if not loaded:
        return f"weights {NO_HASH}"
    return "weights " + ", ".join(f"`{sha}` ({', '.join(names)})" for sha, names in loaded.items())


def wall_time(rows: pd.DataFrame) -> str:
    """How long the command ran, model load to audits (sjd.harness.runner.publish), on the run's device."""
    if "run_wall_s" not in rows or rows["run_wall_s"].isna().all():
        return "wall time not recorded (rerun to record it)"
    seconds = float(rows["run_wall_s"].max())
    return f"wall time {seconds / 60:.1f} min" if seconds >= 60 else f"wall time {seconds:.0f} s"


def machine_load(rows: pd.DataFrame) -> str:
    """What loaded the machine while the run decoded (sjd.harness.contention), and its verdict."""
    if "latency_reliable" not in rows or rows["latency_reliable"].isna().all():
        return "machine load not recorded (rerun to learn whether the latencies were contended)"
    first = rows.iloc[0]
    verdict = "latencies reliable" if bool(first["latency_reliable"]) else "latency columns UNRELIABLE: contended"
    others = ""
    if "others_cores_mean" in rows and pd.notna(first["others_cores_mean"]):
        mean, peak, n = first["others_cores_mean"], first["others_cores_peak"], int(first["load_samples"])
        others = f", other work {mean:.2f} cores on average and {peak:.2f} at its busiest 10 s ({n} samples)"
    return (
        f"machine load: 1-min load {first['load_1min_start']:.2f} before decoding, {first['load_1min_end']:.2f} "
        f"after, on {int(first['usable_cores'])} usable cores, process CPU/wall {first['cpu_per_wall']:.2f}{others}: "
        f"{verdict}"
    )


def page_from_csv(results_dir: Path, out_dir: Path, page: str, render) -> Path | None:
    """docs/results/<page>.md rendered by `render` from results/<page>.csv when that CSV is there (a benchmark
    tool's page); the path written, else None."""
    csv = results_dir / f"{page}.csv"
    if not csv.exists():
        return None
    out = out_dir / f"{page}.md"
    out.write_text(render(pd.read_csv(csv)))
    return out
