"""The budget search's part of the drafters page (studies.budget_search): its table and whether the shipped
calibrated drafter's record names the chosen row."""

import pandas as pd

from sjd.training.drafter_budgets import COLUMNS
from studies.budget_search import budget_lines


def table() -> pd.DataFrame:
    rows = pd.DataFrame({
        "images": [32, 128], "epochs": [1, 3], "accept_sampled": [0.29, 0.62], "reference": "sjd_official",
        "drafted": "eagle_sampled", "n_prompts": 8, "seed": 0, "reference_forwards": [514.4, 514.4],
        "drafted_forwards": [662.9, 390.0], "steps_over_reference": [0.776, 1.319], "published": 1.324,
        "off_published": [-0.414, -0.004], "chosen": [False, True], "recipe_sha": ["aaa", "bbb"],
        "git_hash": "abc",
    })  # fmt: skip
    return rows.reindex(columns=COLUMNS)


def record(images: int, epochs: int, sha: str) -> dict:
    return {"recipe": {"data": {"n_images": images}, "train": {"epochs": epochs}}, "recipe_sha": sha}


def test_the_page_shows_every_budget_and_whether_the_shipped_drafter_names_the_chosen_one():
    text = "\n".join(budget_lines(table(), "assets/cal", record(128, 3, "bbb")))
    assert "| 32 | 1 | 0.286 |" not in text and "| 32 | 1 | 0.290 | 514.4 | 662.9 | 0.776 | -41.4% |  |" in text
    assert "| 128 | 3 | 0.620 | 514.4 | 390.0 | 1.319 | -0.4% | chosen |" in text
    assert "the published 1.324 is chosen" in text
    assert "(`assets/cal/drafter.json`) names the chosen budget and its recipe's hash." in text
    other = "\n".join(budget_lines(table(), "assets/cal", record(32, 1, "aaa")))
    assert "does not name the chosen budget: images: the row's 128, the record's 32" in other


def test_a_search_not_run_yet_says_so():
    assert "Not run yet: the search has written no table." in budget_lines(None, "assets/cal", None)
