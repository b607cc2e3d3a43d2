"""A calibration page's closing section: how near each stand-in comes to the published Lumina-mGPT ratios.

Input: the latest run of each listed command of a `standin_calibration` study (AR, official-schedule SJD at
window 16 and SCD and SJD-PAC at window 64, all on the same prompts and seeds). Per run, the three anchors
of studies.regime (SJD over AR, SCD over SJD, SJD-PAC over SJD) with their 95% intervals, which here are
paired bootstraps over the prompts (the three decoders ran in one run), against the published values in
results/paper/published.csv. The verdict comes from the intervals: a stand-in is calibrated when every anchor's
interval, as a fraction of the paper's value, lies inside 1 +- TOLERANCE; not calibrated when some anchor's lies
wholly outside; not distinguishable at this size otherwise (an interval crosses the band's edge, or is missing).
Each run's stand-in is named by its training record (`model_training`: the recipe, its hashes), so the page
also prints the command that rebuilds a checkpoint the project does not ship.
"""

from __future__ import annotations

import json
import shlex

import pandas as pd

from sjd.standin.procedural import RECIPE_DEFAULTS
from studies import regime
from studies.tables import cell, latest_runs, markdown, with_interval

TOLERANCE = 0.15
# anchor name -> (our decoder, its summary column, its interval's columns); the published rows are regime.ANCHORS'
OURS = {
    "SJD over AR": ("sjd_official", "step_compression"),
    "SCD over SJD": ("scd_official_w64", "vs_sjd_official"),
    "SJD-PAC over SJD": ("sjd_pac_official_w64", "vs_sjd_official"),
}
# The training arguments a page shows (scripts/train_standin.py); a rebuild command gives every argument that
# differs from its default (sjd.standin.procedural.RECIPE_DEFAULTS, the script's own).
RECIPE_SHOWN = ("resolution", "noise", "streak", "streak_corr", "vstreak", "edge", "tint", "row_tint", "steps",
                "hidden", "layers", "heads", "seed")  # fmt: skip


CALIBRATED, NOT_CALIBRATED, UNDECIDED = "calibrated", "not calibrated", "not distinguishable at this size"


def band_verdict(lo: float, hi: float, band: float = TOLERANCE) -> str:
    """inside / outside / crossing: where an interval of ours-over-published lies against 1 +- band."""
    if not (pd.notna(lo) and pd.notna(hi)):
        return "crossing"
    if 1 - band <= lo and hi <= 1 + band:
        return "inside"
    if hi < 1 - band or lo > 1 + band:
        return "outside"
    return "crossing"


def calibration_verdict(bands: list[str]) -> str:
    """The stand-in's verdict from its anchors' band verdicts."""
    if all(b == "inside" for b in bands):
        return CALIBRATED
    return NOT_CALIBRATED if "outside" in bands else UNDECIDED


def published_anchors(published: pd.DataFrame) -> dict[str, float]:
    """anchor name -> the paper's ratio (regime.ANCHORS' published rows)."""
    return {name: regime.published_ratio(published, pub, ref) for name, *_, pub, ref in regime.ANCHORS}


def weights_of(command: str) -> str | None:
    """The checkpoint directory a command points the model at (model.adapter.weights=...), if any."""
    for word in shlex.split(command):
        if word.startswith("model.adapter.weights="):
            return word.split("=", 1)[1]
    return None


def overrides(command: str) -> str:
    """What a command sets beyond its experiment (`-` for none)."""
    words = [w for w in shlex.split(command)[2:] if not w.startswith("experiment=")]
    return " ".join(f"`{w}`" for w in words) or "-"


def rebuild_command(training: dict, out: str) -> str:
    """The train_standin.py command that builds this training record's checkpoint at `out`."""
    name = out.rstrip("/").rsplit("/", 1)[-1]
    args = [f"--{k.replace('_', '-')} {training[k]}" for k, default in RECIPE_DEFAULTS.items()
            if k in training and training[k] != default]  # fmt: skip
    return " ".join(["python scripts/train_standin.py --custom", name, *args, "--out", out])


def recipe_text(training: dict) -> str:
    return ", ".join(f"{k}={training[k]}" for k in RECIPE_SHOWN if k in training)


def run_anchors(rows: pd.DataFrame, published: dict[str, float]) -> dict:
    """One run's row of the calibration table."""
    record = rows["model_training"].iloc[0] if "model_training" in rows else None
    training = json.loads(record) if isinstance(record, str) else None  # None: released weights, or an old row
    ar = rows[rows["decoder"] == rows["baseline"].iloc[0]]
    command = str(rows["command"].iloc[0])
    entropy = float(ar["entropy_nats"].iloc[0]) if len(ar) else float("nan")
    units = rows["n_captions"].iloc[0] if "n_captions" in rows else float("nan")  # prompts: the intervals' units
    out = {"command": command, "model": rows["model"].iloc[0], "weights": weights_of(command) or "shipped",
           "training": training or {}, "entropy_nats": entropy, "n_captions": units}  # fmt: skip
    for name, (decoder, column) in OURS.items():
        row = rows[rows["decoder"] == decoder]
        value, lo, hi = (float(row[c].iloc[0]) if len(row) and c in row else float("nan")
                         for c in (column, f"{column}_lo", f"{column}_hi"))  # fmt: skip
        theirs = published[name]
        out[name] = (value, lo, hi, value / theirs, lo / theirs, hi / theirs)
    out["bands"] = {name: band_verdict(out[name][4], out[name][5]) for name in OURS}
    out["verdict"] = calibration_verdict(list(out["bands"].values()))
    return out


def verdict_text(anchors: dict) -> str:
    """`is calibrated`, or the verdict with the anchors that decide it (their fractions and intervals)."""
    if anchors["verdict"] == CALIBRATED:
        return "is calibrated (every anchor's interval lies inside the band)"
    deciding = "outside" if anchors["verdict"] == NOT_CALIBRATED else "crossing"
    named = [f"{n} {with_interval(*anchors[n][3:6], '.2f', anchors['n_captions'])} of published"
             for n in OURS if anchors["bands"][n] == deciding]  # fmt: skip
    where = "outside the band" if deciding == "outside" else "crossing the band's edge or without an interval"
    return f"is {anchors['verdict']}: {', '.join(named)}, {where}"


def calibration_section(results: pd.DataFrame, commands: list[str], published: pd.DataFrame) -> list[str]:
    """The table of every listed command's latest run: its stand-in, and each anchor with its interval
    and its fraction of the published value; then a sentence per run and the rebuild commands."""
    theirs = published_anchors(published)
    runs = [run_anchors(rows, theirs) for rows in latest_runs(results, commands)]
    if not runs:
        return ["No calibration runs yet: no listed command has rows.", ""]
    lines = [
        "## Against the published ratios",
        "",
        "Each run's three anchors, next to what the papers report on Lumina-mGPT 7B (`results/paper/published.csv`): "
        f"{', '.join(f'{n} {theirs[n]:.2f}' for n in OURS)}. The three decoders ran on the same prompts and seeds, "
        "so every interval is a paired bootstrap over prompts (docs/evaluation.md). A stand-in is calibrated when "
        f"each anchor's interval lies within {TOLERANCE:.0%} of the paper's (0.85 to 1.15 in the `of published` "
        "columns), not calibrated when one lies wholly outside, and not distinguishable at this size otherwise.",
        "",
    ]
    table = pd.DataFrame(
        {
            "model": [r["model"] for r in runs],
            "overrides": [overrides(r["command"]) for r in runs],
            "recipe": [recipe_text(r["training"]) or "-" for r in runs],
            "entropy_nats": [cell(r["entropy_nats"], ".2f") for r in runs],
            **{
                heading: [with_interval(*r[name][i : i + 3], ".2f", r["n_captions"]) for r in runs]
                for name in OURS
                for heading, i in ((name, 0), (f"{name}, of published", 3))
            },
            "calibrated": [r["verdict"] for r in runs],
        }
    )
    lines += [markdown(table), ""]
    for r in runs:
        where = f"`{r['model']}`" + (f" at `{r['weights']}`" if r["weights"] != "shipped" else "")
        lines.append(f"- {where} {verdict_text(r)}.")
    rebuilt = list({r["weights"]: r["training"] for r in runs if r["weights"] != "shipped" and r["training"]}.items())
    if rebuilt:
        lines += ["", "Checkpoints the project does not ship; each command rebuilds one from its recorded recipe "
                  "(`scripts/train_standin.py --check-recipe DIR` confirms the rebuild):", ""]  # fmt: skip
        lines += [f"    {rebuild_command(training, out)}" for out, training in rebuilt]
    return [*lines, ""]
