"""A drafters page's closing section: the trained-drafter decoders against the published references, per run.

Input: the latest run of each listed command of a `drafters` study (conf/experiment/drafters.yaml): AR, the
three decoders the calibration anchors need (official-schedule SJD at window 16, SCD and SJD-PAC at window
64, named as in studies.calibration_page), our best self-drafting decoder, and the decoders that
draft with a trained drafter, all on the same prompts and seeds. Per run:

- whether its stand-in reproduces the published self-drafting ratios (the calibration page's anchors);
- every candidate's step compression over official SJD at window 16 and over SJD-PAC at window 64, with
  their paired intervals over prompts, the drafter forwards it spends per image and the drafter's cost per
  forward relative to the target's in this run, and its one-sample audit;
- the out-of-sample check: the overlay's `study.goal.checked`, `eagle` (EAGLE-2) and `eagle_sampled` (EAGLE-1's
  tree and rule), over official
  SJD, against the published EAGLE over SJD on Lumina-mGPT, a ratio that played no part in calibrating the
  stand-ins. A decoder agrees when the interval of ours over published lies within +-15%, disagrees when it
  lies outside, and is not distinguishable at this size otherwise;
- the goal at window 64, as the overlay's `study.goal` states it (studies.overlays.Goal): the best audited
  lossless candidate at its target times SJD-PAC's step compression. The best of several candidates is picked
  by its point estimate, so its own interval is too generous for a "met": a met needs the confirming run
  (`study.goal.confirming`: fresh seeds and prompts, the chosen decoder beside the references), whose interval
  then decides.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sjd.core.cost import drafter_price as architecture_price
from studies import cost_page, regime
from studies.budget_search import budget_section
from studies.calibration_page import (
    OURS,
    band_verdict,
    published_anchors,
    run_anchors,
    verdict_text,
)
from studies.goal_page import (
    LATENCY_TEXT,
    POWERED_PAGE,
    audit_text,
    best_judged,
    candidate_rows,
    confirming_run,
    faster_clause,
    latency_heading,
    ratio_cells,
    ratio_text,
    references_text,
    step_over,
    step_references,
    steps_text,
    verdict_columns,
)
from studies.latency_verdict import cell as judged_cell
from studies.latency_verdict import judge, verdict
from studies.latency_verdict import ratio_text as latency_text
from studies.overlays import Goal
from studies.tables import NO_HASH, cell, latest_runs, markdown, with_interval

PUBLISHED_EAGLE = ("sjd_pac_lumina_coco5k", "eagle")  # the SJD-PAC README's EAGLE row (Lumina-mGPT, MS-COCO)
PUBLISHED_SJD = ("sjd_pac_lumina_coco5k", "sjd")
BAND = 0.15


BAND_TEXT = {  # calibration_page.band_verdict's three outcomes, as this page says them
    "inside": f"agrees within {BAND:.0%} (the interval lies inside the band)",
    "outside": f"does not agree within {BAND:.0%} (the interval lies outside the band)",
    "crossing": f"is not distinguishable from the {BAND:.0%} band at this size (the interval crosses its edge "
    "or is missing)",
}


def out_of_sample_lines(rows: pd.DataFrame, published: pd.DataFrame, goal: Goal) -> list[str]:
    """The goal's `checked` decoders (`eagle`, `eagle_sampled`) over official SJD against the published EAGLE over
    SJD. A `calibrated` one's drafter was trained to land there, so its ratio is a fit; its test is latency_lines',
    on figures its acceptance moves."""
    theirs = regime.published_ratio(published, PUBLISHED_EAGLE, PUBLISHED_SJD)
    sjd = goal.reference(16)
    column = f"vs_{sjd}"
    lines, bands = [], []
    for decoder in goal.checked:
        row = rows[rows["decoder"] == decoder]
        if row.empty or column not in row:
            continue
        r = row.iloc[0]
        ours, lo, hi = r[column], r.get(f"{column}_lo", np.nan), r.get(f"{column}_hi", np.nan)
        share = with_interval(ours / theirs, lo / theirs, hi / theirs, ".2f")
        band = band_verdict(lo / theirs, hi / theirs, BAND)
        lines.append(
            f"- `{decoder}` over `{sjd}`: {ratio_text(r, column)}, against the published {theirs:.2f} "
            f"(EAGLE {regime.published_compression(published, PUBLISHED_EAGLE):.2f}x over SJD "
            f"{regime.published_compression(published, PUBLISHED_SJD):.2f}x): {share} of published, which "
            f"{BAND_TEXT[band]}."
        )
        if decoder in goal.calibrated:
            lines[-1] += (" Its drafter's training budget was chosen to land on this ratio (a fit, not a test: "
                          f"`{BUDGET_COMMAND}` searches the budgets; its drafter.json holds the command that "
                          "trained it); its test is on latency, below.")  # fmt: skip
        else:
            bands.append(band)
    if not lines:
        return ["- No `eagle` or `eagle_sampled` rows in this run."]
    if any(d in goal.calibrated for d in rows["decoder"]):
        lines += ["", *latency_lines(rows, published, goal)]
    return [*lines, "", trust_line(bands)] if bands else lines


BUDGET_COMMAND = "python -m sjd.training.drafter_budgets"
LATENCY = "modelled_eager_speedup"  # eager, as the published code runs, on the cost validation's GPU


def published_latency(published: pd.DataFrame, row: tuple[str, str]) -> float:
    """A (table, method) row's latency speedup over AR in results/paper/published.csv; NaN when absent."""
    rows = published[(published["table"] == row[0]) & (published["method"] == row[1])]
    return float(rows["latency_speedup"].iloc[0]) if len(rows) else float("nan")


def speedup_over(rows: pd.DataFrame, decoder: str, reference: str | None) -> tuple[float, float, float]:
    """A decoder's modelled eager speedup over AR (its paired interval over prompts), or over `reference`: the
    ratio of the two speedups over AR (both runs' AR is one), bounded by their intervals' far ends (not paired,
    so wider than a paired interval)."""
    by_name = rows.set_index("decoder")
    value, lo, hi = (by_name.loc[decoder].get(f"{LATENCY}{end}", np.nan) for end in ("", "_lo", "_hi"))
    if reference is None:
        return value, lo, hi
    ref, ref_lo, ref_hi = (by_name.loc[reference].get(f"{LATENCY}{end}", np.nan) for end in ("", "_lo", "_hi"))
    return value / ref, lo / ref_hi, hi / ref_lo


def latency_lines(rows: pd.DataFrame, published: pd.DataFrame, goal: Goal) -> list[str]:
    """The test a calibrated drafter was not fitted to, on figures its acceptance moves: each checked decoder's
    modelled latency speedup over AR against the published EAGLE's, and over official SJD against the published
    EAGLE's over SJD's, each read with the page's band; then plainly which pass (inside the band on both)."""
    sjd = goal.reference(16)
    timed = rows[rows[LATENCY].notna()] if LATENCY in rows else rows.iloc[:0]
    decoders = [d for d in goal.checked if d in set(timed["decoder"])]  # rows from before the cost model lack it
    if not decoders or sjd not in set(timed["decoder"]):
        return ["No modelled latency in this run (rows from before the cost model), so the calibrated drafter has "
                "no test here: rerun its command."]  # fmt: skip
    eagle, pub_sjd = published_latency(published, PUBLISHED_EAGLE), published_latency(published, PUBLISHED_SJD)
    targets = {None: (eagle, f"{eagle:.2f}x AR"), sjd: (eagle / pub_sjd, f"{eagle:.2f}/{pub_sjd:.2f} = "
                                                        f"{eagle / pub_sjd:.2f} over SJD")}  # fmt: skip
    lines = [f"Out of sample, on what the drafter's acceptance moves: the modelled latency speedup (Lumina-mGPT-7B "
             f"eager on an {cost_page.VALIDATION_GPU}, as the published code runs and page "
             "[cost_validation](cost_validation.md) prices EAGLE) over AR, with its interval over prompts, and over "
             f"`{sjd}`, bounded by both speedups' intervals, against the published EAGLE's, within "
             f"{BAND:.0%}; decided by the cost model's eager engine at its nominal constants, over prompts (page "
             "cost_validation gives its range over the constants):", ""]  # fmt: skip
    passed = {}
    for decoder in decoders:
        parts, bands = [], []
        for reference, (theirs, said) in targets.items():
            value, lo, hi = speedup_over(rows, decoder, reference)
            band = band_verdict(lo / theirs, hi / theirs, BAND)
            bands.append(band)
            over = "AR" if reference is None else f"`{reference}`"
            parts.append(f"over {over} {with_interval(value, lo, hi, '.2f')} against the published {said}: "
                         f"{with_interval(value / theirs, lo / theirs, hi / theirs, '.2f')} of it, which "
                         f"{BAND_TEXT[band].split(' (')[0]}")  # fmt: skip
        passed[decoder] = all(b == "inside" for b in bands)
        kind = " (calibrated)" if decoder in goal.calibrated else ""
        lines.append(f"- `{decoder}`{kind}: " + "; ".join(parts) + ".")
    return [*lines, "", pass_line(rows, published, goal, passed)]


def pass_line(rows: pd.DataFrame, published: pd.DataFrame, goal: Goal, passed: dict[str, bool]) -> str:
    """Which decoders pass the latency test, which do not, and, for one that passes with a step ratio outside the
    band, why its pass is no reproduction: efficiency prices a forward, not what it accepts."""
    yes, no = ([f"`{d}`" for d, ok in passed.items() if ok is want] for want in (True, False))
    text = ("Passes (inside the band on both): " + ", ".join(yes) + "; does not: " + (", ".join(no) or "none") + "."
            if yes else "Neither passes: no decoder lies inside the band on both.")  # fmt: skip
    theirs = regime.published_ratio(published, PUBLISHED_EAGLE, PUBLISHED_SJD)
    column = f"vs_{goal.reference(16)}"
    by_name = rows.set_index("decoder")
    pub = published_latency(published, PUBLISHED_EAGLE) / regime.published_compression(published, PUBLISHED_EAGLE)
    for decoder, ok in passed.items():
        lo, hi = by_name.loc[decoder].get(f"{column}_lo", np.nan), by_name.loc[decoder].get(f"{column}_hi", np.nan)
        steps_inside = band_verdict(lo / theirs, hi / theirs, BAND) == "inside"
        if ok == steps_inside:
            continue
        efficiency = (f"modelled efficiency, the speedup over the step compression, "
                      f"{cell(by_name.loc[decoder].get('modelled_eager_efficiency', np.nan), '.2f')} against the "
                      f"published {pub:.2f}")  # fmt: skip
        if ok:
            text += (f" `{decoder}` passes with its step compression over SJD outside the band: more accepted "
                     "drafts than the published run's make up for forwards the model prices dearer than that run's "
                     f"({efficiency}), two departures that cancel, not a reproduction.")  # fmt: skip
        else:
            text += (f" `{decoder}` misses with its step compression over SJD inside the band: the model prices "
                     f"its forwards dearer than the published run's ({efficiency}; page "
                     "[cost_validation](cost_validation.md) separates the drafter's forwards from our "
                     "implementation's operator calls between them).")  # fmt: skip
    return text


def trust_line(bands: list[str]) -> str:
    """What the out-of-sample check means for the stand-in's drafter rows, from its band verdicts."""
    setting = ("The published run's EAGLE version, drafter and tree are not stated; the one public EAGLE for "
               "Lumina-mGPT (LANTERN's) defaults to EAGLE-1's static tree, which `eagle_sampled` runs.")  # fmt: skip
    if "outside" in bands:
        return ("So this stand-in, calibrated on self-drafting ratios, does not carry a drafter's ratio over: a "
                "drafter's acceptance depends on how closely a one-layer drafter can imitate its target, which a "
                "tiny stand-in and a 7B model need not share. The drafter rows here, and their ratios to the "
                "self-drafting decoders, are measurements of this stand-in with a drafter of our recipe, not "
                f"predictions for Lumina-mGPT; a real model's run decides. {setting}")  # fmt: skip
    if all(b == "inside" for b in bands):
        return ("The stand-in carries the published drafter ratio over, out of sample: some support for reading "
                f"its drafter rows as it reads its self-drafting ones. {setting}")  # fmt: skip
    return f"Not distinguishable at this size whether the stand-in carries a drafter's ratio over. {setting}"


def cost_cells(candidates: pd.DataFrame) -> tuple[list[str], list[str]]:
    forwards = [cell(v, ".1f") for v in candidates.get("drafter_forwards", pd.Series(np.nan, candidates.index))]
    cost = [cell(v, ".2f") for v in candidates.get("drafter_cost", pd.Series(np.nan, candidates.index))]
    return forwards, cost


ROOT = Path(__file__).resolve().parents[1]
CHAMELEON_PRICE = architecture_price("chameleon_7b")  # an EAGLE drafter forward of Lumina-mGPT-7B, in its forwards


def drafter_price(model: str) -> float:
    """A drafter forward's price in target forwards for `model`: the drafter's weight bytes over the target's
    for the real architecture conf/model/<model>.yaml prices it as (`prices_as`, sjd.core.cost); NaN where the
    model names none."""
    from omegaconf import OmegaConf

    path = ROOT / "conf" / "model" / f"{model}.yaml"
    return architecture_price(OmegaConf.load(path).get("prices_as") if path.is_file() else None)


def fe_over(rows: pd.DataFrame, candidates: pd.DataFrame, reference: str) -> list[str]:
    """Each candidate's forward-equivalent compression over `reference`'s: the reference's target forwards per
    image over the candidate's target forwards plus its drafter forwards at their price (drafter_price). A
    point estimate, from the run's mean forwards (rows written before fe_compression was recorded have it)."""
    by_name = rows.set_index("decoder")
    if reference not in by_name.index:
        return ["-"] * len(candidates)
    from sjd.core.cost import priced_forwards

    price = drafter_price(str(rows["model"].iloc[0]))
    drafted = candidates.get("drafter_forwards", pd.Series(np.nan, candidates.index))
    priced = priced_forwards(candidates["n_forward"], drafted, price)
    return [cell(v, ".2f") for v in float(by_name.loc[reference, "n_forward"]) / priced]


def fe_cells(rows: pd.DataFrame, candidates: pd.DataFrame, reference: str, units: float) -> list[str]:
    """The run's own `fe_vs_<reference>` with its interval over prompts (sjd.harness.intervals); rows written
    before the run recorded it get fe_over's point estimate from their mean forwards."""
    column = f"fe_vs_{reference}"
    if column in candidates and candidates[column].notna().all():
        return ratio_cells(candidates, column, units)
    return fe_over(rows, candidates, reference)


def goal_lines(
    rows: pd.DataFrame, candidates: pd.DataFrame, confirmations: list[pd.DataFrame], goal: Goal
) -> list[str]:
    """Each of the goal's targets (the 1.25x window-64 goal, in latency over the faster of SJD-PAC and SCD) in this
    run, and where one is met, the confirming run's verdict."""
    return [line for window, target in sorted(goal.targets.items())
            for line in target_lines(rows, candidates, confirmations, goal, window, target)]  # fmt: skip


def target_lines(
    rows: pd.DataFrame,
    candidates: pd.DataFrame,
    confirmations: list[pd.DataFrame],
    goal: Goal,
    window: int,
    target: float,
) -> list[str]:
    references = goal.latency_references(window)
    found = best_judged(rows, candidates, window, references)
    if found is None:
        return [f"- Window {window}: no lossless candidate whose one-sample audit passes has a latency, measured "
                f"or modelled, over {references_text(references)}."]  # fmt: skip
    best, judged, _ = found
    outcome = verdict(judged, target)
    spent = cell(best.get("drafter_forwards"), ".1f")
    spending = f"spending {spent} drafter forwards per image" if spent else "drafting without a drafter"
    line = (f"- Window {window}: the best is `{best['decoder']}` at {latency_text(judged)} times the latency of "
            f"{references_text(references)}{faster_clause(judged)}, {spending}; "
            f"{steps_text(rows, best, goal.reference(window))}. In this run the {target}x target is {outcome}. "
            f"Its {audit_text(best)}.")  # fmt: skip
    if not outcome.startswith("met"):
        return [line]
    run = confirming_run(best, confirmations)
    if run is None:
        return [line + " It was picked among several by its point estimate, so the met is pending: no confirming "
                f"run (`experiment={goal.confirming}`) of it on this model yet."]  # fmt: skip
    again = judge(run, run[run["decoder"] == best["decoder"]].iloc[0], references)
    return [line + f" Confirming run on fresh seeds and prompts: {latency_text(again)}; the target is "
            f"{verdict(again, target)}."]  # fmt: skip


def run_part(
    rows: pd.DataFrame,
    published: pd.DataFrame,
    confirmations: list[pd.DataFrame],
    goal: Goal,
    powered: pd.DataFrame | None,
) -> list[str]:
    anchors = run_anchors(rows, published_anchors(published))
    fractions = ", ".join(f"{name} {with_interval(*anchors[name][3:6], '.2f', anchors['n_captions'])}" for name in OURS)
    lines = [f"### `{anchors['model']}`: {anchors['command']}", "",
             f"Against the published self-drafting ratios (within 15%, from the intervals), this run's stand-in "
             f"{verdict_text(anchors)} (of published: {fractions}).", ""]  # fmt: skip
    candidates = candidate_rows(rows, goal, powered)
    units = rows["n_captions"].iloc[0] if "n_captions" in rows else np.nan
    forwards, cost = cost_cells(candidates)
    table = pd.DataFrame(
        {
            "decoder": candidates["decoder"],
            "width": candidates["window"],
            "step compression": ratio_cells(candidates, "step_compression", units),
            **{
                f"over {ref}": [step_over(rows, r, ref) for _, r in candidates.iterrows()]
                for ref in step_references(goal)
            },
            "drafter forwards per image": forwards,
            "drafter cost per forward": cost,
            **{
                f"fe compression over {ref}": fe_cells(rows, candidates, ref, units) for ref in goal.references.values()
            },
            **{
                latency_heading(refs): [judged_cell(judge(rows, r, refs)) for _, r in candidates.iterrows()]
                for refs in (goal.latency_references(w) for w in sorted(goal.references))
            },  # fmt: skip
            **verdict_columns(candidates),
        }
    )
    lines += [markdown(table), "", "Against the published EAGLE over SJD (out of sample; decided by steps):", ""]
    lines += out_of_sample_lines(rows, published, goal)
    lines += ["", "The goal in this run:", ""]
    lines += goal_lines(rows, candidates, confirmations, goal)
    return [*lines, ""]


def drafters_section(
    results: pd.DataFrame,
    commands: list[str],
    published: pd.DataFrame,
    goal: Goal,
    powered: pd.DataFrame | None = None,
) -> list[str]:
    """Per listed command's latest run (the confirming runs among them are read only as confirmations);
    `powered` holds the audits with power (the goal page's), which decide a candidate's `audited_lossless`."""
    runs = latest_runs(results, commands)
    if not runs:
        return ["No drafter runs yet: no listed command has rows.", ""]
    confirmations = [r for r in runs if goal.confirming in set(r.get("experiment", pd.Series(dtype=str)))]
    lines = [
        "## Trained drafters against the published references",
        "",
        f"Every candidate's step compression over official-schedule SJD at window 16 and over SJD-PAC with its "
        f"official algorithm and settings at window 64, on the same prompts and seeds (paired bootstrap "
        f"intervals over prompts). `width` is the target forward's width: the window, or a draft tree's root "
        f"and nodes. `drafter forwards per image` are the drafter's own forwards beside the target's; `drafter "
        f"cost per forward` is the drafter's time per forward over the target's model time per forward, in "
        f"this run, on this machine (a tiny stand-in's time says little about a 7B model). `fe compression over` "
        f"a reference prices the drafter as a GPU would: the reference's target forwards over the candidate's "
        f"target forwards plus its drafter forwards, each at the drafter's weight bytes over the target's for the "
        f"real architecture the stand-in stands for ({CHAMELEON_PRICE:.3f} of a forward for Chameleon-7B's drafter "
        f"with the full head; sjd/core/cost.py); with its interval over prompts "
        f"(a point estimate for rows written before runs recorded it). `latency over` a reference is the "
        f"reference's latency over the candidate's, drafter forwards and the decoder's own calls and syncs priced. "
        f"{LATENCY_TEXT} The goal below is in latency, at window 64 over the faster of SJD-PAC and SCD "
        f"({references_text(goal.latency_references(64))}); step compression is shown, never decisive. "
        f"A candidate counts when its one-sample audit passes and AR's control "
        f"passes; {regime.AUDITED_TEXT} `powered audit p` is the latest audit with power of a decoder with the "
        f"same settings, whatever its name, and the same weights (page [{POWERED_PAGE}]({POWERED_PAGE}.md); "
        f"`{NO_HASH}` beside it where a row predates the hashes of the weights runs loaded, so the same weights "
        "rest on the stand-in's recorded training hash or the model's name); where there is one its verdict "
        "decides `audited_lossless`.",
        "",
    ]
    for rows in runs:
        if any(rows is c for c in confirmations):
            continue
        lines += run_part(rows, published, confirmations, goal, powered)
    if goal.calibrated:
        lines += budget_section()
    return lines
