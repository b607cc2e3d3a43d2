"""A goal page's closing section: the lossless decoders against both published references, in one run.

Input: the latest run of each listed command of a `goal` study (conf/experiment/beyond_sjd_pac.yaml): AR, the
three decoders the calibration anchors need (official-schedule SJD at window 16, SCD and SJD-PAC at window 64,
named as in studies.calibration_page), and candidate lossless decoders at windows 16 and 64, all on
the same prompts and seeds. Per run:

- whether its stand-in reproduces the published ratios (the calibration page's anchors and 15% verdict);
- per candidate, step compression over official SJD at window 16 and over official SJD-PAC at window 64, each
  with its paired bootstrap interval over prompts, and its one-sample audit;
- the goal, from the overlay's `study.goal` (studies.overlays.Goal): a lossless decoder whose one-sample audit
  passes, at window 16 at least its target times official SJD's step compression, and at window 64 at least its
  target times SJD-PAC's. A target is met when the
  interval lies above it, missed when it lies below, and not distinguishable at this size otherwise; a decoder
  audited without power is named as such (studies.regime.audited_lossless_flag);
- where the powered audit page (results/studies/audit_powered.csv, experiment=audit_powered and its siblings)
  holds the latest audit of a decoder with the same settings (whatever its name) on the same weights and
  sampling, that audit's verdict decides the candidate's `audited_lossless`: the goal run's own audit is far too
  small for power;
- the window-16 target read the other way too, as official SJD's window and not the candidate's: the best
  passing candidate at any window against official SJD at window 16, where it is not the window-16 one;
- candidates at windows wider than 64 say whether the window is what limits the family: where a far wider
  window compresses little more than window 64, a target beyond it needs other drafts, not a wider window;
- per candidate, the share of its forwards that committed a single code (from the run's `accept_hist`, the
  prefill's first code included): mostly forwards whose first draft was rejected with no sibling to catch the
  residual, which is where the coupled family loses its steps (docs/algorithms.md §6.1).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from studies import regime
from studies.calibration_page import OURS, published_anchors, run_anchors, verdict_text
from studies.overlays import Goal
from studies.tables import NO_HASH, cell, latest_runs, markdown, with_interval

POWERED_PAGE = "audit_powered"  # results/studies/<this>.csv holds the audits with power
# a powered audit's audited_lossless flag, in words
POWERED_OUTCOME = {
    True: "with power",
    False: "rejected",
    None: "without a verdict (AR's control failed or too few tokens)",
}
ANCHOR_DECODERS = tuple(decoder for decoder, _ in OURS.values())  # the calibration anchors' decoders


def references(goal: Goal) -> tuple[str, ...]:
    """The decoders no candidate can be: AR, the goal's references and the calibration anchors' decoders."""
    return ("ar", *goal.references.values(), *ANCHOR_DECODERS)


def shown_ratios(goal: Goal) -> list[tuple[str, str]]:
    """(heading, summary column) of the ratios each candidate's row shows, with their intervals: step compression
    over each reference, then what a GPU would pay over it (fe compression and modelled latency)."""
    refs = [ref for _, ref in sorted(goal.references.items())]
    return [("step compression", "step_compression"),
            *((f"over {ref}", f"vs_{ref}") for ref in refs),
            *((f"fe over {ref}", f"fe_vs_{ref}") for ref in refs),
            *((f"modelled over {ref}", f"modelled_vs_{ref}") for ref in refs)]  # fmt: skip


MODELLED_MEASURE = "modelled latency (Lumina-mGPT-7B on an H100, forwards graphed; sjd.harness.pricing)"
STEP_MEASURE = "step compression (these rows predate the cost model: rerun the command to decide on modelled latency)"


def deciding_column(candidates: pd.DataFrame, reference: str) -> tuple[str, str]:
    """The ratio a target is decided on, and its name: the modelled latency over `reference` where the run has
    it, else the step compression over it (rows written before the cost model)."""
    column = f"modelled_vs_{reference}"
    if column in candidates and candidates[column].notna().any():
        return column, MODELLED_MEASURE
    return f"vs_{reference}", STEP_MEASURE


def forward_width(config: dict) -> int:
    """A decoder's forward width: its `window`, or a draft tree's `total_tokens` (root and nodes)."""
    return int(config["window"] if "window" in config else config["total_tokens"])


def candidate_rows(rows: pd.DataFrame, goal: Goal, powered: pd.DataFrame | None = None) -> pd.DataFrame:
    """The run's lossless candidates (every decoder claiming exactness but the references), with their window
    and audit flag (each row carries AR's one-sample p as `tf_control_p`); a matching powered audit's flag
    replaces the run's own, and its p, tokens and experiment are kept as `powered_*`."""
    configs = json.loads(rows["decoder_configs"].iloc[0])
    lossless = json.loads(rows["decoder_lossless"].iloc[0])
    excluded = references(goal)
    keep = rows[[d not in excluded and bool(lossless.get(d)) for d in rows["decoder"]]].copy()
    keep["window"] = [forward_width(configs[d]) for d in keep["decoder"]]
    keep["lossless"] = True
    run = rows.iloc[0].to_dict()  # one model, one set of weights and one sampling a run
    verdicts = [regime.audit_verdict(r, configs[r["decoder"]], powered, run) for r in keep.to_dict("records")]
    keep["audited_lossless"] = [flag for flag, _ in verdicts]
    audits = [audit for _, audit in verdicts]
    keep["powered_p"] = [a["tf_p"] if a else np.nan for a in audits]
    keep["powered_tokens"] = [a["tf_n_tokens"] if a else np.nan for a in audits]
    keep["powered_experiment"] = [a["experiment"] if a else None for a in audits]
    keep["powered_weights"] = [regime.weights_match_text(a) if a else None for a in audits]  # hashed, or no hash
    return keep


def target_verdict(lo: float, hi: float, target: float) -> str:
    """How the 95% interval stands against the target: met, missed, or not distinguishable at this size."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "not distinguishable from it at this size (the ratio has no interval)"
    if lo >= target:
        return "met (the interval lies above it)"
    if hi < target:
        return "missed (the interval lies below it)"
    return "not distinguishable from it at this size (the interval includes it)"


def audit_text(row: pd.Series) -> str:
    p, n, needed = row.get("tf_p", np.nan), row.get("tf_n_tokens", np.nan), row.get("tf_tokens_needed", np.nan)
    if np.isfinite(row.get("powered_p", np.nan)):
        outcome = POWERED_OUTCOME[row["audited_lossless"]]
        return (f"one-sample p = {row['powered_p']:.3g} on {int(row['powered_tokens'])} tokens in "
                f"`experiment={row['powered_experiment']}`{weights_note(row['powered_weights'])}, "
                f"{outcome}")  # fmt: skip
    if not np.isfinite(p):
        return "no one-sample audit"
    power = "with power" if row["audited_lossless"] is True else f"without power (needs {needed:.0f} tokens)"
    return f"one-sample p = {p:.3g} on {int(n)} tokens, {power}"


def weights_note(match: str) -> str:
    """Nothing where a powered audit's weights matched the run's by hash; else `(same weights: n/a: no hash)`."""
    return "" if match == "hashed" else f" (same weights: {NO_HASH})"


def passing(candidates: pd.DataFrame) -> pd.DataFrame:
    """The candidates the goal may name (studies.regime.counts_for_goal)."""
    return candidates[candidates.apply(regime.counts_for_goal, axis=1).astype(bool)] if len(candidates) else candidates


def also_steps(row: pd.Series, column: str, reference: str) -> str:
    """Where a target is decided on modelled latency, the step compression over the same reference beside it."""
    steps = f"vs_{reference}"
    return "" if column == steps else f" ({ratio_text(row, steps)} times its step compression)"


def goal_lines(
    candidates: pd.DataFrame,
    window: int,
    reference: str,
    target: float,
    confirmations: tuple[pd.DataFrame, ...] = (),
) -> list[str]:
    """The goal at one window: the passing candidate with the highest ratio to `reference` on the deciding
    measure (deciding_column), and its verdict (a confirming run's, where the met is a selection's)."""
    column, measure = deciding_column(candidates, reference)
    counted = passing(candidates)
    at = counted[counted["window"] == window]
    if at.empty or column not in at or at[column].isna().all():
        return [f"- Window {window}: no lossless candidate whose one-sample audit passes has a ratio to `{reference}`."]
    best = at.loc[at[column].idxmax()]
    verdict = verdict_of(best, column, target)
    caveat = selection_caveat(verdict, len(at), best, column, target, confirmations)
    line = (f"- Window {window}: the best is `{best['decoder']}` at {ratio_text(best, column)} times "
            f"`{reference}`'s {measure}{also_steps(best, column, reference)}; the {target}x target is {verdict}. "
            f"Its {audit_text(best)}.{caveat}")  # fmt: skip
    audited = at[at["audited_lossless"].apply(lambda flag: flag is True)]
    if best["audited_lossless"] is not True and not audited.empty and audited[column].notna().any():
        top = audited.loc[audited[column].idxmax()]
        line += (f" The best audited with power is `{top['decoder']}` at {ratio_text(top, column)}; the target is "
                 f"{verdict_of(top, column, target)}. Its {audit_text(top)}.")  # fmt: skip
    return [line]


def any_window_lines(candidates: pd.DataFrame, goal: Goal, confirmations: tuple[pd.DataFrame, ...] = ()) -> list[str]:
    """The window-16 target against the best passing candidate at any window (when that one is wider than 16)."""
    if 16 not in goal.targets:
        return []
    reference, target = goal.reference(16), goal.targets[16]
    column, measure = deciding_column(candidates, reference)
    counted = passing(candidates)
    if counted.empty or column not in counted or counted[column].isna().all():
        return []
    best = counted.sort_values(column).iloc[-1]
    if best["window"] == 16:
        return []  # the window-16 line has said it
    verdict = verdict_of(best, column, target)
    return [f"- Any window against `{reference}` at window 16 (the target read as SJD's window, not the "
            f"candidate's): the best is `{best['decoder']}` at window {best['window']}, {ratio_text(best, column)} "
            f"times its {measure}; the {target}x target is {verdict}. Its {audit_text(best)}."
            f"{selection_caveat(verdict, len(counted), best, column, target, confirmations)}"]  # fmt: skip


def confirming_row(best: pd.Series, confirmations: Sequence[pd.DataFrame]) -> pd.Series | None:
    """The chosen candidate's row in the latest confirming run on its model (fresh prompts and seeds), if any."""
    confirmed = [c[c["decoder"] == best["decoder"]] for c in confirmations if best["model"] in set(c["model"])]
    confirmed = [c.iloc[0] for c in confirmed if len(c)]
    return confirmed[-1] if confirmed else None


def selection_caveat(
    verdict: str,
    candidates: int,
    best: pd.Series,
    column: str,
    target: float,
    confirmations: Sequence[pd.DataFrame],
) -> str:
    """A met of the best of several candidates, picked by its point estimate, is pending: its own interval is too
    generous for the winner of a selection, so a confirming run on fresh seeds and prompts has to decide it; where
    one has run (`confirmations`: the goal's `confirming` experiment), its interval is the verdict."""
    if not verdict.startswith("met") or candidates < 2:
        return ""
    again = confirming_row(best, confirmations)
    if again is None:
        return (f" It was picked among {candidates} candidates by its point estimate, so the met is pending a "
                "confirming run of it alone beside the references on fresh prompts and seeds.")  # fmt: skip
    return (f" It was picked among {candidates} candidates by its point estimate; in the confirming run of it alone "
            f"beside the references on fresh prompts and seeds (`experiment={again['experiment']}`) it is at "
            f"{ratio_text(again, column)}, and the target is {verdict_of(again, column, target)}.")  # fmt: skip


def ratio_text(row: pd.Series, column: str) -> str:
    return with_interval(row[column], row.get(f"{column}_lo"), row.get(f"{column}_hi"), ".2f")


def verdict_of(row: pd.Series, column: str, target: float) -> str:
    return target_verdict(row.get(f"{column}_lo", np.nan), row.get(f"{column}_hi", np.nan), target)


def wider_lines(candidates: pd.DataFrame, goal: Goal) -> list[str]:
    """Whether the window limits: the best passing candidate at each window wider than 64, against the best at 64."""
    counted = passing(candidates)
    sjd, pac = goal.reference(16), goal.reference(64)
    at64 = counted[counted["window"] == 64]
    lines = []
    for window in sorted(w for w in counted["window"].unique() if w > 64):
        best = counted[counted["window"] == window].sort_values("step_compression").iloc[-1]
        line = (
            f"- Window {window} (is the window the limit?): the best is `{best['decoder']}` at step compression "
            f"{ratio_text(best, 'step_compression')}, {ratio_text(best, f'vs_{sjd}')} times "
            f"`{sjd}` and {ratio_text(best, f'vs_{pac}')} times `{pac}`"
        )
        if not at64.empty:
            top = at64.loc[at64["step_compression"].idxmax()]
            line += f", against {top['step_compression']:.2f} for the best at window 64 (`{top['decoder']}`)"
        lines.append(line + ".")
    return lines


def single_code_share(accept_hist: str | float) -> float:
    """The share of a decoder's commits that are one code long, from its `accept_hist` ({length: count}, JSON)."""
    if not isinstance(accept_hist, str):
        return np.nan
    counts = {int(k): v for k, v in json.loads(accept_hist).items()}
    total = sum(counts.values())
    return counts.get(1, 0) / total if total else np.nan


def verdict_columns(candidates: pd.DataFrame) -> dict[str, list[str]]:
    """The columns the goal and drafters tables end with (candidate_rows): how often a decoder commits one code, its
    run's one-sample p, the powered audit behind its verdict, and that verdict."""
    missing = pd.Series(np.nan, candidates.index)
    return {
        "one-code commits": [cell(single_code_share(h), ".0%") for h in candidates.get("accept_hist", missing)],
        "one-sample p": [cell(p, ".3g") for p in candidates.get("tf_p", missing)],
        "powered audit p (tokens)": [
            f"{p:.3g} ({int(n)}{'' if w == 'hashed' else f'; {NO_HASH}'})" if np.isfinite(p) else "-"
            for p, n, w in zip(candidates["powered_p"], candidates["powered_tokens"], candidates["powered_weights"])
        ],
        "audited_lossless": [regime.flag_text(v) for v in candidates["audited_lossless"]],
    }


def ratio_cells(rows: pd.DataFrame, column: str, units: float) -> list[str]:
    """`value (lo-hi)` of a summary column for each row."""
    return [with_interval(r.get(column), r.get(f"{column}_lo"), r.get(f"{column}_hi"), ".2f", units)
            for _, r in rows.iterrows()]  # fmt: skip


def run_part(
    rows: pd.DataFrame,
    published: dict[str, float],
    goal: Goal,
    powered: pd.DataFrame | None = None,
    confirmations: tuple[pd.DataFrame, ...] = (),
) -> list[str]:
    anchors = run_anchors(rows, published)
    fractions = ", ".join(f"{name} {with_interval(*anchors[name][3:6], '.2f', anchors['n_captions'])}" for name in OURS)
    lines = [f"### `{anchors['model']}`: {anchors['command']}", "",
             f"Against the published ratios (within 15%, from the intervals), this run's stand-in "
             f"{verdict_text(anchors)} (of published: {fractions}).",
             ""]  # fmt: skip
    candidates = candidate_rows(rows, goal, powered)
    units = rows["n_captions"].iloc[0] if "n_captions" in rows else np.nan
    table = pd.DataFrame(
        {
            "decoder": candidates["decoder"],
            "schedule": candidates["schedule"].fillna(""),
            "window": candidates["window"],
            **{heading: ratio_cells(candidates, column, units) for heading, column in shown_ratios(goal)},
            **verdict_columns(candidates),
        }
    )
    lines += [markdown(table), "", "The goal in this run:", ""]
    for window, target in sorted(goal.targets.items()):
        reference = goal.reference(window)
        lines += goal_lines(candidates, window, reference, target, confirmations)
    lines += any_window_lines(candidates, goal, confirmations)
    lines += wider_lines(candidates, goal)
    return [*lines, ""]


def target_text(goal: Goal, window: int) -> str:
    return f"target {goal.targets[window]}x at window {window}" if window in goal.targets else "no target there"


def goal_section(
    results: pd.DataFrame,
    commands: list[str],
    published: pd.DataFrame,
    goal: Goal,
    powered: pd.DataFrame | None = None,
) -> list[str]:
    """Per listed command's latest run: its calibration check, the candidates' table and the verdicts on `goal`'s
    targets (its overlay's `study.goal`); `powered` holds the audits with power (POWERED_PAGE's rows) that may
    back a candidate."""
    runs = latest_runs(results, commands)
    if not runs:
        return ["No goal runs yet: no listed command has rows.", ""]
    confirmations = tuple(r for r in runs if goal.confirming in set(r.get("experiment", pd.Series(dtype=str))))
    lines = [
        "## The goal against both references",
        "",
        f"Every lossless candidate's step compression over official-schedule SJD at window 16 "
        f"({target_text(goal, 16)}) and over SJD-PAC with its official algorithm and settings at window 64 "
        f"({target_text(goal, 64)}), and beside it what a GPU would pay over each: `fe over` the "
        "reference's forwards over the candidate's with drafter forwards priced at their bytes, and `modelled over` "
        "the reference's modelled latency over the candidate's (Lumina-mGPT-7B on an H100, every forward a CUDA "
        "graph, the decoder's own calls and syncs priced; sjd/harness/pricing.py, checked against the published "
        "latencies on page [cost_validation](cost_validation.md)). Targets are decided on the modelled latency "
        "where the run has it. Every decoder ran on the same prompts and seeds, so each interval "
        "is a paired bootstrap over prompts. A candidate counts when its one-sample audit passes (p > "
        f"{regime.TF_ALPHA:g}) and AR's control passes; {regime.AUDITED_TEXT} The goal run's own audit is "
        f"far below power; `powered audit p` is the latest audit with power of a decoder with the same settings "
        f"(whatever its name) on the same model (page [{POWERED_PAGE}]({POWERED_PAGE}.md); `{NO_HASH}` beside it "
        "where a row predates the hashes of the weights runs loaded, so the same weights rest on the stand-in's "
        "recorded training hash or the model's name), and where there is "
        "one its verdict decides `audited_lossless`. `one-code commits` is the share of the candidate's forwards "
        "that committed a single code: mostly forwards whose first draft was rejected with no sibling to catch the "
        "residual (the one-code steps a schedule takes by design count too).",
        "",
    ]
    theirs = published_anchors(published)
    for rows in runs:
        if any(rows is c for c in confirmations):
            continue  # read as a confirmation of a selection run's met, not as a run of its own
        lines += run_part(rows, theirs, goal, powered, confirmations)
    return lines
