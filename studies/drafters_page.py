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
from studies.tables import cell, latest_runs, markdown, with_interval

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
    SJD. A `calibrated` one's drafter was trained to land there, so its ratio is a fit, and its test is its modelled
    latency efficiency against the published EAGLE's (the cost validation's band and engine)."""
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
            lines[-1] += " " + calibrated_text(rows, r, published)
        else:
            bands.append(band)
    if not lines:
        return ["- No `eagle` or `eagle_sampled` rows in this run."]
    return [*lines, "", trust_line(bands)] if bands else lines


def calibrated_text(rows: pd.DataFrame, row: pd.Series, published: pd.DataFrame) -> str:
    """A calibrated drafter's line: its ratio is a fit; its out-of-sample test is its modelled latency efficiency
    (eager, as the published code runs, on the cost validation's GPU) against the published EAGLE's, and, as the
    cost page reads a miss, the same with its own calls and syncs per iteration charged at official SJD's."""
    pub = published[(published["table"] == PUBLISHED_EAGLE[0]) & (published["method"] == PUBLISHED_EAGLE[1])].iloc[0]
    theirs = pub["latency_speedup"] / pub["step_compression"]
    lo, hi = row.get("modelled_eager_efficiency_lo", np.nan), row.get("modelled_eager_efficiency_hi", np.nan)
    mine = with_interval(row.get("modelled_eager_efficiency", np.nan), lo, hi, ".2f")
    text = (
        "Its drafter's training budget was chosen to land on this ratio (a fit, not a test: "
        "`python scripts/train_drafter.py` with the command in its drafter.json). Out of sample, its modelled "
        f"latency efficiency (eager on an {cost_page.VALIDATION_GPU}, as page [cost_validation](cost_validation.md) "
        f"prices EAGLE) is {mine} against the published {pub['latency_speedup']:.2f}/"
        f"{pub['step_compression']:.2f} = {theirs:.2f}: {cost_page.verdict(lo, hi, theirs)} "
        f"(band +-{cost_page.BAND:.2f}; decided by the cost model's eager engine at its nominal constants, over "
        "prompts: page cost_validation gives its range over the constants)."
    )
    if cost_page.SJD in set(rows["decoder"]) and "decoder_ops_per_iter" in rows:
        other = cost_page.modelled_efficiency(rows, row["decoder"], cost_page.VALIDATION_GPU, "eager", cost_page.SJD)
        text += (
            f" With its own calls and syncs per iteration ({row['decoder_ops_per_iter']:.0f} calls) charged at "
            f"`{cost_page.SJD}`'s count instead, it would be {other:.2f} (a point): the drafter's strength does not "
            "move the miss, our implementation's operator calls between forwards do."
        )
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
        f"same settings, whatever its name, and the same weights (page [{POWERED_PAGE}]({POWERED_PAGE}.md)); "
        "where there is one its verdict decides `audited_lossless`.",
        "",
    ]
    for rows in runs:
        if any(rows is c for c in confirmations):
            continue
        lines += run_part(rows, published, confirmations, goal, powered)
    return lines
