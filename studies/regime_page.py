"""A regime page's closing sections: the combined table, its figure, the published anchors, the goal."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sjd.harness.intervals import excludes_one
from sjd.harness.prompts import resolve_path
from studies import figures, regime
from studies.overlays import Study
from studies.tables import NO_INTERVAL, cell, interval_cells, latest_runs, markdown

PUBLISHED = resolve_path("results/paper/published.csv")
REGIME_SHOWN = (("entropy_nats", ".2f"), ("step_compression", ".2f"), ("inputs_per_token", ".2f"),
                ("vs_official_sjd", ".2f"), ("vs_harness_sjd", ".2f"), ("latency_speedup", ".2f"),
                ("efficiency", ".2f"), ("audit_p", ".3g"), ("audit_tv", ".3f"), ("audit_noise_tv", ".3f"))  # fmt: skip
# The decoder each ratio column is a ratio to (others: AR, the baseline).
REFERENCE_OF = {"vs_official_sjd": regime.OFFICIAL_REFERENCES, "vs_harness_sjd": regime.HARNESS_SJD}
READING = (
    "Reading these: a stand-in's forward is a tiny network's, far cheaper than the bookkeeping around it on a "
    "CPU, so its latency speedups say little about a 7B model on a GPU; step compression is what carries over. "
)


def regime_section(
    page: str,
    results: pd.DataFrame,
    studies: list[Study],
    out_dir: Path,
    tables_dir: Path,
    powered: pd.DataFrame | None = None,
) -> list[str]:
    """The combined table of every listed command's latest run (also written as <tables_dir>/<page>.csv),
    its figure, the published-ratio anchors per model, and the restated goal (studies.regime)."""
    runs = latest_runs(results, [c for s in studies for c in s.commands])
    if not runs:
        return ["No regime map yet: no listed command has rows.", ""]
    table = regime.regime_table(runs, powered)  # a powered audit decides a decoder's audited_lossless, as elsewhere
    tables_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(tables_dir / f"{page}.csv", index=False, float_format="%.6g")
    figure = f"{page}.png"
    figures.regime_map(table, out_dir / figure)
    reading = [READING + regime.power_text(table), ""]
    sections = [*combined_table(page, table, figure), *anchor_section(table), *goal_section(table)]
    return [*sections, *seed_section(regime.seed_calibration(runs)), *reading]


def seed_section(calibration: pd.DataFrame) -> list[str]:
    """The one-sample audit's calibration across seeds: how often AR and the lossless decoders pass it."""
    if calibration.empty:
        return []
    shown = calibration.assign(smallest_p=[cell(p, ".3g") for p in calibration["smallest_p"]])
    return [
        "## The one-sample audit at several seeds",
        "",
        "Every one-sample audit of AR and of a decoder that claims to be lossless, over all the runs above, per "
        "model (one audit per run and decoder, whatever its window, study or seed), with the smallest p and where: "
        f"an exact sampler's p is uniform, so about {regime.TF_ALPHA:g} of them fail at "
        f"p <= {regime.TF_ALPHA:g} by chance, and many more failures would mean a miscalibrated test or a "
        "decoder that is not exact. Passing here says the test does not reject exact samplers too often; "
        "at these sizes it is no evidence of exactness (the power columns above say so).",
        "",
        markdown(shown),
        "",
    ]


def combined_table(page: str, table: pd.DataFrame, figure: str) -> list[str]:
    shown = table[["model", "decoder", "schedule", "window", "images", "lossless", "audited_lossless"]].astype(str)
    shown["audited_lossless"] = [regime.flag_text(v) for v in table["audited_lossless"]]
    for column, fmt in REGIME_SHOWN:
        if column in regime.INTERVAL_SOURCES:  # a ratio: its interval beside it, bare on its reference row
            reference = REFERENCE_OF.get(column, "ar")
            shown[column] = interval_cells(table, column, f"{column}_lo", f"{column}_hi", fmt, reference)
        else:
            shown[column] = [cell(v, fmt) for v in table[column]]
    return ["## The regime map", "",
            f"All the runs above in one table (also `results/{page}.csv`), ordered by the model's per-token "
            "entropy. `vs_official_sjd` and `vs_harness_sjd` are step compression over SJD's in the same run; "
            "where two runs measure one cell, the table keeps the one with more `images`; "
            f"`lossless` is the decoder's claim; {regime.AUDITED_TEXT}", "", f"![regime map]({figure})", "",
            markdown(shown), ""]  # fmt: skip


def anchor_section(table: pd.DataFrame) -> list[str]:
    anchors = regime.anchors(table, pd.read_csv(PUBLISHED))
    anchor_table = anchors[["model", "anchor", "drafts"]].copy()
    anchor_table["entropy_nats"] = [cell(v, ".2f") for v in anchors["entropy_nats"]]
    for column in ("ours", "published", "ours_over_published"):
        if f"{column}_lo" in anchors:
            anchor_table[column] = interval_cells(anchors.assign(decoder=""), column, f"{column}_lo",
                                                  f"{column}_hi", ".2f", None)  # fmt: skip
        else:
            anchor_table[column] = [cell(v, ".2f") for v in anchors[column]]
    return ["## Against the published ratios", "",
            "Each model's SJD step compression over AR (official schedule, window 16), and SCD's and "
            "SJD-PAC's (official schedule, window 64) over that SJD's, next to what the papers report on "
            "Lumina-mGPT 7B (`results/paper/published.csv`); 1.00 in the last column reproduces the paper. "
            "The interval of a ratio over AR is its run's bootstrap interval; of a ratio between two runs "
            "(windows 64 and 16), the delta method on both runs' standard errors, taken as independent. `drafts`: "
            "`official` where the SJD, SCD and SJD-PAC rows draw random drafts at grammar-forced slots too, as the "
            "official samplers do (`sjd_official` and the rest, experiment=regime_anchors), `forced` where a model "
            "has only the regime map's runs, whose official-schedule rows keep the harness's forced drafts "
            "(`sjd_official_forced` and the rest).", "",
            markdown(anchor_table), ""]  # fmt: skip


def goal_section(table: pd.DataFrame) -> list[str]:
    """The best audited lossless decoder against both SJDs, overall and on the official schedule."""
    lines = ["## Twice official SJD, losslessly", "",
             "Decided by steps: this goal is step compression over each SJD's, not latency.", ""]  # fmt: skip
    shown_decoders = set()
    published_sjd = regime.published_compression(pd.read_csv(PUBLISHED), regime.SJD_ROW)
    for schedule in (None, "official"):
        best = regime.goal(table, published_sjd, schedule=schedule)
        among = "" if schedule is None else " among the decoders on the official schedule"
        if best is None:
            lines += ["No run has official-schedule SJD at window 16.", ""]
            break
        if best["decoder"] in shown_decoders:  # the best decoder overall is on the official schedule
            continue
        shown_decoders.add(best["decoder"])
        if best["decoder"] is None:
            lines += [regime.not_audited_text(best["model"], among, table), ""]
            continue
        lines += [goal_sentence(best, among, published_sjd), ""]
    return lines


def goal_sentence(best: dict, among: str, published_sjd: float) -> str:
    """The goal's decoder and its ratios with their intervals, then, against each SJD, a verdict the
    interval supports: above or below where it excludes 1, not distinguishable where it does not."""

    def ratio(column: str, unit: str = "") -> str:
        return interval_cells(pd.DataFrame([best]), column, f"{column}_lo", f"{column}_hi", ".2f", None, unit)[0]

    which = (f"the audited lossless decoder with the highest measured step compression at window 16{among} is"
             if best.get("audited", True) else f"no lossless decoder{among} is audited with power at window 16; of "
             "those whose one-sample audit passes without power, the one with the highest measured step compression "
             "is")  # fmt: skip
    audit = f"one-sample audit p = {best['tf_p']:.3g} on {int(best['tf_n_tokens'])} tokens"
    if not best.get("audited", True):
        audit += (f", fewer than the {best['tf_tokens_needed']:.0f} that detect a 0.01 nats/token excess, so its "
                  "exactness at this size is claimed, not audited")  # fmt: skip
    text = (
        f"On `{best['model']}`, the model whose official-schedule SJD at window 16 compresses closest to the "
        f"published {published_sjd:.2f}x, {which} `{best['decoder']}`: {ratio('vs_official_sjd', 'x')} "
        f"official-schedule SJD's step compression (target 2x) and {ratio('vs_harness_sjd', 'x')} "
        "harness-schedule SJD's (target 1.5x); "
        f"latency speedup {ratio('latency_speedup')} and efficiency {ratio('efficiency')} over AR; {audit}."
    )
    against = (("vs_official_sjd", "official-schedule SJD"), ("vs_harness_sjd", "harness-schedule SJD"))
    if all(excludes_one(best.get(f"{c}_lo"), best.get(f"{c}_hi")) is None for c, _ in against):
        return (
            f"{text} These rows have no intervals ({NO_INTERVAL}), so the page does not say that "
            f"`{best['decoder']}` compresses more than either SJD."
        )
    return " ".join([text, *(verdict(best, column, name) for column, name in against)])


def verdict(best: dict, column: str, name: str) -> str:
    """Whether the goal's decoder compresses more than `name`, as far as the 95% interval can tell."""
    lo, hi = best.get(f"{column}_lo"), best.get(f"{column}_hi")
    apart = excludes_one(lo, hi)
    if apart is None:
        return (
            f"Against {name} this row has no interval ({NO_INTERVAL}), so the page does not say that "
            f"`{best['decoder']}` compresses more than {name}."
        )
    if not apart:
        return f"At this size `{best['decoder']}` and {name} are not distinguishable: the 95% interval includes 1."
    side = "more" if lo > 1 else "less"
    return f"`{best['decoder']}` compresses {side} than {name}: the 95% interval excludes 1."
