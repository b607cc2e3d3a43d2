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
from studies.latency_verdict import RANGE_TEXT, Judged, bounds, combined, faster_text, judge, verdict
from studies.latency_verdict import cell as judged_cell
from studies.latency_verdict import ratio_text as latency_text
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


def step_references(goal: Goal) -> list[str]:
    """Every reference a step compression is shown over: each window's reference, then the `faster_of` ones."""
    names = [ref for _, ref in sorted(goal.references.items())]
    names += [name for _, more in sorted(goal.faster_of.items()) for name in more]
    return list(dict.fromkeys(names))


def references_text(references: Sequence[str]) -> str:
    """`a`, or the faster of `a` and `b`."""
    if len(references) == 1:
        return f"`{references[0]}`"
    return "the faster of " + " and ".join(f"`{r}`" for r in references)


def judged_at(rows: pd.DataFrame, candidates: pd.DataFrame, references: Sequence[str]) -> dict[str, Judged]:
    """Each candidate's latency ratio over (the faster of) `references` in its run (studies.latency_verdict)."""
    return {row["decoder"]: judge(rows, row, references) for _, row in candidates.iterrows()}


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
    """How a 95% interval of step compression stands against a target: met, missed, or not distinguishable at this
    size (the wider windows' lines; a latency target is decided by studies.latency_verdict)."""
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


def steps_text(rows: pd.DataFrame, row: pd.Series, reference: str) -> str:
    """The step compression over `reference`, shown beside a latency verdict (never deciding it)."""
    return f"its step compression is {step_over(rows, row, reference)} times `{reference}`'s (shown, not decisive)"


def step_over(rows: pd.DataFrame, row: pd.Series, reference: str) -> str:
    """`value (lo-hi)` of a row's step compression over `reference`: the run's paired ratio where recorded, else the
    two rows' own intervals combined as independent (studies.latency_verdict.combined); "" for the reference."""
    if row["decoder"] == reference or not (rows["decoder"] == reference).any():
        return ""
    column = f"vs_{reference}"
    if column in row and pd.notna(row[column]):
        return ratio_text(row, column)
    theirs = rows[rows["decoder"] == reference].iloc[0]
    mine, ref = bounds(row, "step_compression"), bounds(theirs, "step_compression")
    return with_interval(mine[0] / ref[0], *combined(mine, ref), ".2f")


def best_judged(
    rows: pd.DataFrame, candidates: pd.DataFrame, window: int, references: Sequence[str]
) -> tuple[pd.Series, Judged, int] | None:
    """The passing candidate at `window` with the highest latency ratio over `references` (its point: measured, or
    the model's at the default engine), its judgement and how many it was picked among; None where no passing
    candidate has a latency."""
    counted = passing(candidates)
    at = counted[counted["window"] == window] if len(counted) else counted
    judged = {d: j for d, j in judged_at(rows, at, references).items() if j.by}
    if not judged:
        return None
    name = max(judged, key=lambda d: judged[d].point)
    return at[at["decoder"] == name].iloc[0], judged[name], len(judged)


def goal_lines(
    rows: pd.DataFrame,
    candidates: pd.DataFrame,
    window: int,
    goal: Goal,
    target: float,
    confirmations: tuple[pd.DataFrame, ...] = (),
) -> list[str]:
    """The goal at one window: the passing candidate with the highest latency ratio over the window's references
    (the faster of them), and its verdict (a confirming run's, where the met is a selection's)."""
    references = goal.latency_references(window)
    found = best_judged(rows, candidates, window, references)
    if found is None:
        return [f"- Window {window}: no lossless candidate whose one-sample audit passes has a latency, measured or "
                f"modelled, over {references_text(references)}."]  # fmt: skip
    best, judged, among = found
    outcome = verdict(judged, target)
    line = (f"- Window {window}: the best is `{best['decoder']}` at {latency_text(judged)} times the latency of "
            f"{references_text(references)}{faster_clause(judged)}; {steps_text(rows, best, goal.reference(window))}. "
            f"The {target}x target is {outcome}. Its {audit_text(best)}."
            f"{selection_caveat(outcome, among, best, references, target, confirmations)}")  # fmt: skip
    audited = passing(candidates)
    audited = audited[(audited["window"] == window) & audited["audited_lossless"].apply(lambda f: f is True)]
    if best["audited_lossless"] is not True and not audited.empty:
        found = best_judged(rows, audited, window, references)
        if found is not None:
            top, top_judged, _ = found
            line += (f" The best audited with power is `{top['decoder']}` at {latency_text(top_judged)}; the target "
                     f"is {verdict(top_judged, target)}. Its {audit_text(top)}.")  # fmt: skip
    return [line]


def faster_clause(judged: Judged) -> str:
    """Which reference was the faster, and which the run lacks."""
    parts = [faster_text(judged)] if faster_text(judged) else []
    if judged.missing:
        parts.append(f"this run has no {' or '.join(f'`{m}`' for m in judged.missing)} row: read against the others")
    return f" ({'; '.join(parts)})" if parts else ""


def any_window_lines(
    rows: pd.DataFrame, candidates: pd.DataFrame, goal: Goal, confirmations: tuple[pd.DataFrame, ...] = ()
) -> list[str]:
    """The window-16 target against the best passing candidate at any window (when that one is wider than 16)."""
    if 16 not in goal.targets:
        return []
    references, target = goal.latency_references(16), goal.targets[16]
    counted = passing(candidates)
    judged = {d: j for d, j in judged_at(rows, counted, references).items() if j.by}
    if not judged:
        return []
    name = max(judged, key=lambda d: judged[d].point)
    best = counted[counted["decoder"] == name].iloc[0]
    if best["window"] == 16:
        return []  # the window-16 line has said it
    outcome = verdict(judged[name], target)
    return [f"- Any window against {references_text(references)} at window 16 (the target read as SJD's window, not "
            f"the candidate's): the best is `{name}` at window {best['window']}, {latency_text(judged[name])} times "
            f"its latency; the {target}x target is {outcome}. Its {audit_text(best)}."
            f"{selection_caveat(outcome, len(judged), best, references, target, confirmations)}"]  # fmt: skip


def confirming_run(best: pd.Series, confirmations: Sequence[pd.DataFrame]) -> pd.DataFrame | None:
    """The latest confirming run on the chosen candidate's model (fresh prompts and seeds) that decoded it, if any."""
    found = [c for c in confirmations if best["model"] in set(c["model"]) and (c["decoder"] == best["decoder"]).any()]
    return found[-1] if found else None


def confirming_row(best: pd.Series, confirmations: Sequence[pd.DataFrame]) -> pd.Series | None:
    """The chosen candidate's row in the latest confirming run on its model (fresh prompts and seeds), if any."""
    run = confirming_run(best, confirmations)
    return None if run is None else run[run["decoder"] == best["decoder"]].iloc[0]


def selection_caveat(
    outcome: str,
    candidates: int,
    best: pd.Series,
    references: Sequence[str],
    target: float,
    confirmations: Sequence[pd.DataFrame],
) -> str:
    """A met of the best of several candidates, picked by its point estimate, is pending: its own interval is too
    generous for the winner of a selection, so a confirming run on fresh seeds and prompts has to decide it; where
    one has run (`confirmations`: the goal's `confirming` experiment), its verdict is the verdict."""
    if not outcome.startswith("met") or candidates < 2:
        return ""
    run = confirming_run(best, confirmations)
    if run is None:
        return (f" It was picked among {candidates} candidates by its point estimate, so the met is pending a "
                "confirming run of it alone beside the references on fresh prompts and seeds.")  # fmt: skip
    again = judge(run, run[run["decoder"] == best["decoder"]].iloc[0], references)
    return (f" It was picked among {candidates} candidates by its point estimate; in the confirming run of it alone "
            f"beside the references on fresh prompts and seeds (`experiment={run['experiment'].iloc[0]}`) it is at "
            f"{latency_text(again)}, and the target is {verdict(again, target)}.")  # fmt: skip


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


def latency_heading(references: Sequence[str]) -> str:
    return f"latency over {references_text(references).replace('`', '')}"


def ratio_columns(rows: pd.DataFrame, shown: pd.DataFrame, goal: Goal, units: float) -> dict[str, list[str]]:
    """The ratio columns of a goal table, for each shown row of the run `rows`: step compression, over each reference
    (studies.goal_page.step_references: shown, never decisive), then the latency over AR and over each window's
    references (the faster of them), measured or modelled over its range (studies.latency_verdict)."""
    baseline = rows["baseline"].iloc[0] if "baseline" in rows else "ar"
    columns = {"step compression": ratio_cells(shown, "step_compression", units)}
    for ref in step_references(goal):
        columns[f"over {ref}"] = [step_over(rows, r, ref) for _, r in shown.iterrows()]
    for references in [(baseline,), *(goal.latency_references(w) for w in sorted(goal.references))]:
        columns[latency_heading(references)] = [
            "" if r["decoder"] in references else judged_cell(judge(rows, r, references)) for _, r in shown.iterrows()
        ]
    return columns


def reference_rows(rows: pd.DataFrame, goal: Goal) -> pd.DataFrame:
    """The run's rows of the goal's references, in step_references' order, each with its window."""
    configs = json.loads(rows["decoder_configs"].iloc[0])
    present = [r for r in step_references(goal) if (rows["decoder"] == r).any()]
    shown = pd.concat([rows[rows["decoder"] == r] for r in present]) if present else rows.iloc[:0]
    return shown.copy().assign(window=[forward_width(configs[d]) for d in shown["decoder"]])


def goal_table(rows: pd.DataFrame, candidates: pd.DataFrame, goal: Goal) -> pd.DataFrame:
    """The references, then every candidate: window, the ratio columns, and the candidates' audit columns."""
    refs = reference_rows(rows, goal)
    shown = pd.concat([refs, candidates], ignore_index=True)
    units = rows["n_captions"].iloc[0] if "n_captions" in rows else np.nan
    blank = [""] * len(refs)
    return pd.DataFrame(
        {
            "decoder": shown["decoder"],
            "role": ["reference"] * len(refs) + ["candidate"] * len(candidates),
            "schedule": shown["schedule"].fillna(""),
            "window": shown["window"],
            **ratio_columns(rows, shown, goal, units),
            **{heading: blank + cells for heading, cells in verdict_columns(candidates).items()},
        }
    )


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
    lines += [markdown(goal_table(rows, candidates, goal)), "", "The goal in this run:", ""]
    for window, target in sorted(goal.targets.items()):
        lines += goal_lines(rows, candidates, window, goal, target, confirmations)
    lines += any_window_lines(rows, candidates, goal, confirmations)
    lines += wider_lines(candidates, goal)
    return [*lines, ""]


def target_text(goal: Goal, window: int) -> str:
    if window not in goal.targets:
        return "no target there"
    return f"target {goal.targets[window]}x {references_text(goal.latency_references(window))} in latency"


LATENCY_TEXT = (
    "A latency column holds a ratio of latencies: measured where both rows were timed on the real architecture "
    "(a `shadow` run; parentheses hold its 95% interval), else the cost model's (Lumina-mGPT-7B on an H100; "
    "sjd/harness/pricing.py and sjd/harness/model_range.py) at the default engine, every forward a CUDA graph, with "
    f"its bracket holding {RANGE_TEXT}: its lowest corner's lower bound to its highest corner's upper bound. A "
    "latency target is met only where it holds over that whole range (or on measured time), missed where the whole "
    "range lies below it, and depends on the engine where one engine's range lies on one side and another's does "
    "not. A verdict of the model is the model's, not a measurement: whether any engine of it can be trusted is "
    "page [cost_validation](cost_validation.md)'s question, each engine against the published latencies beside two "
    "models that know nothing of a GPU."
)


def goal_section(
    results: pd.DataFrame,
    commands: list[str],
    published: pd.DataFrame,
    goal: Goal,
    powered: pd.DataFrame | None = None,
) -> list[str]:
    """Per listed command's latest run: its calibration check, the references' and candidates' table and the
    verdicts on `goal`'s targets (its overlay's `study.goal`); `powered` holds the audits with power (POWERED_PAGE's
    rows) that may back a candidate."""
    runs = latest_runs(results, commands)
    if not runs:
        return ["No goal runs yet: no listed command has rows.", ""]
    confirmations = tuple(r for r in runs if goal.confirming in set(r.get("experiment", pd.Series(dtype=str))))
    lines = [
        "## The goal against the published references",
        "",
        f"Every lossless candidate against official-schedule SJD at window 16 ({target_text(goal, 16)}) and at "
        f"window 64 against SJD-PAC and SCD with their official algorithms and settings ({target_text(goal, 64)}): "
        "SCD is the faster published lossless decoder in latency, so a target over SJD-PAC alone would mostly "
        "measure SCD's lead. The references lead the table. Step compression over each reference is shown, never "
        f"decisive: the targets are in latency. {LATENCY_TEXT} Every decoder ran on the same prompts and seeds, so "
        "a run's intervals are paired bootstraps over prompts (step compression over a reference the run did not "
        "pair with, as SCD in rows written before it was one, combines the two rows' own intervals as independent). "
        "A candidate counts when its one-sample audit passes (p > "
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
