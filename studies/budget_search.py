"""The calibrated drafter's budget search on the drafters page: results/drafter_budgets.csv, written by
`python -m sjd.training.drafter_budgets` (conf/drafter_budgets.yaml), one row a training budget, and whether the
shipped calibrated drafter's record names the row the search chose."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from sjd.training.drafter_budgets import CONFIG, chosen_budget, record_matches
from studies.tables import markdown

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = "results/drafter_budgets.csv"
COMMAND = "python -m sjd.training.drafter_budgets"


def shipped_record(root: Path = ROOT) -> tuple[str, dict | None]:
    """The searched model's calibrated drafter (its model config's `drafter_calibrated`) and its drafter.json."""
    model = OmegaConf.load(CONFIG).model
    path = OmegaConf.load(root / "conf" / "model" / f"{model}.yaml").get("drafter_calibrated")
    record = root / str(path) / "drafter.json" if path else None
    return str(path), json.loads(record.read_text()) if record is not None and record.is_file() else None


def budget_lines(table: pd.DataFrame | None, drafter: str, record: dict | None) -> list[str]:
    """The search's table, the chosen row, and whether `record` (the shipped drafter's) names it."""
    head = [f"### The budget search behind the calibrated drafter (`{COMMAND}`)", ""]
    if table is None or table.empty:
        return [*head, "Not run yet: the search has written no table.", ""]
    shown = pd.DataFrame({
        "images": table["images"], "epochs": table["epochs"],
        "1 - TV (held out)": table["accept_sampled"].map("{:.3f}".format),
        f"{table['reference'].iloc[0]} forwards": table["reference_forwards"].map("{:.1f}".format),
        f"{table['drafted'].iloc[0]} forwards": table["drafted_forwards"].map("{:.1f}".format),
        "steps over the reference": table["steps_over_reference"].map("{:.3f}".format),
        "off published": table["off_published"].map("{:+.1%}".format),
        "chosen": table["chosen"].map(lambda c: "chosen" if bool(c) else ""),
    })  # fmt: skip
    row = chosen_budget(table)
    lines = [*head, f"Each budget (images x epochs of the drafter recipe) trains a drafter, then "
             f"`{table['drafted'].iloc[0]}` with it and `{table['reference'].iloc[0]}` decode the same "
             f"{int(table['n_prompts'].iloc[0])} held-out prompts (seed {int(table['seed'].iloc[0])}); the budget "
             f"whose step compression over the reference lands nearest the published {row['published']:.3f} is "
             f"chosen. From `{BUDGETS}` (git `{table['git_hash'].iloc[0]}`).", "", markdown(shown), ""]  # fmt: skip
    if record is None:
        return [*lines, f"No calibrated drafter is shipped at `{drafter}`.", ""]
    departs = record_matches(pd.Series({k: getattr(v, "item", lambda v=v: v)() for k, v in row.items()}), record)
    verdict = ("names the chosen budget and its recipe's hash" if not departs else
               "does not name the chosen budget: " + "; ".join(departs))  # fmt: skip
    return [*lines, f"The shipped calibrated drafter's record (`{drafter}/drafter.json`) {verdict}.", ""]


def budget_section(root: Path = ROOT) -> list[str]:
    path = root / BUDGETS
    drafter, record = shipped_record(root)
    return budget_lines(pd.read_csv(path) if path.is_file() else None, drafter, record)
