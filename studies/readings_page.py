"""The part of a `readings` study's page after its frontier figure (conf/experiment/ssd_readings.yaml): the SSD rows
of one run, each our reading of the paper's settings, with their step compression, modelled speedup, excess nats a
token and impossible tokens split into a block's top row and the rows below it; the reading that comes nearest the
published figure (results/paper/published.csv). Every number comes from the run's rows or the published table."""

from __future__ import annotations

import json

import pandas as pd

from studies.tables import cell, interval_cells, markdown

READER_CLASS = "SSDDecoder"  # the decoder whose settings the rows read (sjd.decoders.ssd)
PUBLISHED_METHOD = "ssd"  # its name in results/paper/published.csv
# The published column a reading is held against, in order of preference: the figure the brief of the study names
# is a step compression; where the paper's summaries give a speedup only, that is what there is to hold it against.
PUBLISHED_COLUMNS = ("step_compression", "latency_speedup")


def reading_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of a run decoded by SSD (its `decoder_classes` record), in the run's order."""
    classes = json.loads(rows["decoder_classes"].iloc[0])
    return rows[[classes.get(d) == READER_CLASS for d in rows["decoder"]]]


def settings_columns(readings: pd.DataFrame) -> pd.DataFrame:
    """rounds, rows in flight (the top active row and `rows_below` under it) and block width of each reading."""
    configs = json.loads(readings["decoder_configs"].iloc[0])
    mine = [configs[d] for d in readings["decoder"]]
    return pd.DataFrame(
        {
            "reading": [f"`{d}`" for d in readings["decoder"]],
            "rounds": [c["rounds"] for c in mine],
            "rows in flight": [1 + c["rows_below"] for c in mine],
            "block width": [c["window"] for c in mine],
        }
    )


def cost_model_range(readings: pd.DataFrame) -> list[str]:
    """The modelled speedup's range over the cost model's constants and the prompts, where the rows carry it."""
    lo, hi = "modelled_speedup_range_lo", "modelled_speedup_range_hi"
    if lo not in readings or readings[lo].isna().all():
        return ["n/a: not recorded"] * len(readings)
    return [f"{cell(a, '.2f')}-{cell(b, '.2f')}" for a, b in zip(readings[lo], readings[hi])]


def readings_table(readings: pd.DataFrame) -> pd.DataFrame:
    """One line per reading: its settings, step compression and modelled speedup with their intervals over prompts,
    the modelled speedup's range over the cost model's constants, excess nats a token and impossible tokens, all of
    them, in a block's top row and in the rows below it."""
    table = settings_columns(readings)
    shown = readings.assign(decoder=readings["decoder"].astype(str))
    table["step compression"] = interval_cells(shown, "step_compression", "step_compression_lo",
                                               "step_compression_hi", ".2f", None)  # fmt: skip
    table["modelled speedup"] = interval_cells(shown, "modelled_speedup", "modelled_speedup_lo",
                                               "modelled_speedup_hi", ".2f", None)  # fmt: skip
    table["over the cost model's constants"] = cost_model_range(readings)
    for column, heading, fmt in (
        ("tf_excess_nats", "excess nats/token", ".4f"),
        ("tf_zero_share", "impossible tokens", ".2%"),
        ("tf_zero_share_top_row", "in the top row", ".2%"),
        ("tf_zero_share_rows_below", "in the rows below", ".2%"),
    ):
        values = readings[column] if column in readings else pd.Series([float("nan")] * len(readings))
        table[heading] = [cell(v, fmt) or "n/a" for v in values]
    return table


def published_figure(published: pd.DataFrame, model: str) -> tuple[float, str, str] | None:
    """The published SSD figure for the run's model family (value, its column, its source), or None."""
    same_model = published["model"].astype(str).map(model.__contains__)  # lumina: standin_lumina_*
    theirs = published[(published["method"] == PUBLISHED_METHOD) & same_model]
    for column in PUBLISHED_COLUMNS:
        given = theirs[theirs[column].notna()]
        if not given.empty:
            row = given.iloc[0]
            return float(row[column]), column, str(row["source"])
    return None


def nearest_lines(readings: pd.DataFrame, published: pd.DataFrame) -> list[str]:
    """Which reading's step compression comes nearest the published figure, and which reading's modelled speedup."""
    found = published_figure(published, str(readings["model"].iloc[0]))
    if found is None:
        return [f"No published `{PUBLISHED_METHOD}` figure for this model in results/paper/published.csv.", ""]
    value, column, source = found
    kind = "a step compression" if column == "step_compression" else "a speedup over AR, not a step compression"
    lines = [f"The published figure is {value:.2f}x, column `{column}` of results/paper/published.csv: {kind}, for "
             f"the model its source names, not for this stand-in. Source: {source}.", ""]  # fmt: skip
    for measure, label in (("step_compression", "step compression"), ("modelled_speedup", "modelled speedup")):
        given = readings.dropna(subset=[measure])
        if given.empty:
            continue
        nearest = given.loc[(given[measure] - value).abs().idxmin()]
        lines.append(
            f"- By {label}: `{nearest['decoder']}` (our reading), {nearest[measure]:.2f}x, "
            f"{nearest[measure] / value:.2f} of the published figure."
        )
    return [*lines, ""]


def split_lines(readings: pd.DataFrame) -> list[str]:
    """Where each reading's impossible tokens fall: the share in the rows below over the share in the top row."""
    columns = ("tf_zero_share_top_row", "tf_zero_share_rows_below")
    if any(c not in readings or readings[c].isna().all() for c in columns):
        return ["No split of the impossible tokens: these rows predate it (rerun to record it).", ""]
    split = readings.dropna(subset=list(columns))
    below_more = int((split[columns[1]] > split[columns[0]]).sum())
    return [
        f"Impossible tokens (committed codes the target gives probability 0: outside its top-k / top-p or the "
        f"grammar), split by the row of its block that committed each: in {below_more} of {len(split)} readings "
        "the rows below a block's top row (drafted from the row above by the below head where its features are "
        "there, and verified on part of the rows above only) carry the larger share; the top row is drafted along "
        "the row by the right head.",
        "",
    ]


def readings_lines(rows: pd.DataFrame, published: pd.DataFrame) -> list[str]:
    """The readings part of one run's page: what the rows are, their table, the nearest reading and the split."""
    readings = reading_rows(rows)
    if readings.empty:
        return ["No SSD rows in this run.", ""]
    return [
        "Every SSD row here is **our reading** of the SSD paper, not the paper's decoder: the text we have leaves "
        "its rounds, rows in flight, block width and acceptance rule open, and each row fixes them one way (the "
        "acceptance rule is the harness's in all of them: each position on its own, docs/algorithms.md §12.9). "
        "The modelled speedup is the cost model's (sjd.harness.pricing: this stand-in's forwards priced on a GPU as "
        "the architecture it stands for), with its interval over prompts and its range over the cost model's "
        "constants.",
        "",
        markdown(readings_table(readings)),
        "",
        *nearest_lines(readings, published),
        *split_lines(readings),
    ]
