"""A regime page's closing sections: the combined table, its figure, the published anchors, the goal."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sjd.harness import plots, regime
from sjd.harness.prompts import resolve_path
from sjd.harness.reports.studies import Study
from sjd.harness.reports.tables import cell, latest_run, markdown

PUBLISHED = resolve_path("results/paper/published.csv")
REGIME_SHOWN = (("entropy_nats", ".2f"), ("step_compression", ".2f"), ("vs_official_sjd", ".2f"),
                ("vs_harness_sjd", ".2f"), ("latency_speedup", ".2f"), ("efficiency", ".2f"), ("audit_p", ".3g"),
                ("audit_tv", ".3f"), ("audit_noise_tv", ".3f"))  # fmt: skip
READING = [
    "Reading these: a stand-in's forward is a tiny network's, far cheaper than the bookkeeping around it on a "
    "CPU, so its latency speedups say little about a 7B model on a GPU; step compression is what carries over. "
    "At the audit sizes these runs afford, the per-position test has almost no power on a high-entropy model "
    "(compare `audit_tv` with AR's own `audit_noise_tv`): it catches only gross departures from AR. The "
    "lossless decoders' exactness is asserted by the audits of `tests/test_audit.py` on the micro model, whose "
    "output space is enumerated.",
    "",
]


def regime_section(
    page: str, results: pd.DataFrame, studies: list[Study], out_dir: Path, tables_dir: Path
) -> list[str]:
    """The combined table of every listed command's latest run (also written as <tables_dir>/<page>.csv),
    its figure, the published-ratio anchors per model, and the restated goal (sjd.harness.regime)."""
    commands = results["command"] if "command" in results else pd.Series([None] * len(results))
    runs = [latest_run(results[commands == c]) for s in studies for c in s.commands if (commands == c).any()]
    if not runs:
        return ["No regime map yet: no listed command has rows.", ""]
    table = regime.regime_table(runs)
    tables_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(tables_dir / f"{page}.csv", index=False, float_format="%.6g")
    figure = f"{page}.png"
    plots.regime_map(table, out_dir / figure)
    return [*combined_table(page, table, figure), *anchor_section(table), *goal_section(table), *READING]


def combined_table(page: str, table: pd.DataFrame, figure: str) -> list[str]:
    shown = table[["model", "decoder", "schedule", "window", "lossless", "audited_lossless"]].astype(str)
    for column, fmt in REGIME_SHOWN:
        shown[column] = [cell(v, fmt) for v in table[column]]
    return ["## The regime map", "",
            f"All the runs above in one table (also `results/{page}.csv`), ordered by the model's per-token "
            "entropy. `vs_official_sjd` and `vs_harness_sjd` are step compression over SJD's in the same run; "
            "`lossless` is the decoder's claim, `audited_lossless` a claim the audit did not reject at p >= "
            f"{regime.AUDIT_ALPHA}.", "", f"![regime map]({figure})", "", markdown(shown), ""]  # fmt: skip


def anchor_section(table: pd.DataFrame) -> list[str]:
    anchors = regime.anchors(table, pd.read_csv(PUBLISHED))
    anchor_table = anchors[["model", "anchor"]].copy()
    for column in ("entropy_nats", "ours", "published", "ours_over_published"):
        anchor_table[column] = [cell(v, ".2f") for v in anchors[column]]
    return ["## Against the published ratios", "",
            "Each model's SJD step compression over AR (official schedule, window 16), and SCD's and "
            "SJD-PAC's (official schedule, window 64) over that SJD's, next to what the papers report on "
            "Lumina-mGPT 7B (`results/paper/published.csv`); 1.00 in the last column reproduces the paper.", "",
            markdown(anchor_table), ""]  # fmt: skip


def goal_section(table: pd.DataFrame) -> list[str]:
    """The best audited lossless decoder against both SJDs, overall and on the official schedule."""
    lines = ["## Twice official SJD, losslessly", ""]
    shown_decoders = set()
    for schedule in (None, "official"):
        best = regime.goal(table, schedule=schedule)
        among = "" if schedule is None else " among the decoders on the official schedule"
        if best is None:
            lines += ["No run has official-schedule SJD at window 16.", ""]
            break
        if best["decoder"] in shown_decoders:  # the best decoder overall is on the official schedule
            continue
        shown_decoders.add(best["decoder"])
        if best["decoder"] is None:
            lines += [f"On `{best['model']}` no audited lossless decoder{among} ran at window 16.", ""]
            continue
        lines += [goal_sentence(best, among), ""]
    return lines


def goal_sentence(best: dict, among: str) -> str:
    return (
        f"On `{best['model']}`, the model whose official-schedule SJD at window 16 compresses closest to the "
        f"published {regime.SJD_PUBLISHED:.2f}x, the audited lossless decoder with the highest step compression "
        f"at window 16{among} is `{best['decoder']}`: {best['vs_official_sjd']:.2f}x official-schedule SJD's "
        f"step compression (target 2x) and {best['vs_harness_sjd']:.2f}x harness-schedule SJD's (target 1.5x); "
        f"latency speedup {best['latency_speedup']:.2f} and efficiency {best['efficiency']:.2f} over AR; audit "
        f"p = {best['audit_p']:.3g}."
    )
