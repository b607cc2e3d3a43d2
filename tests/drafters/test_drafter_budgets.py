"""The calibrated drafter's budget search (`python -m sjd.training.drafter_budgets`, conf/drafter_budgets.yaml): one
row a budget, the budget nearest the published EAGLE over SJD marked chosen, and a drafter's record told apart from
a row it was not trained as; at a tiny size on the micro model."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sjd.training.drafter_budgets import (
    COLUMNS,
    chosen_budget,
    mark_chosen,
    published_target,
    record_matches,
    search,
    search_config,
)

TINY = ["model=micro", "budgets=[[2,1],[3,1]]", "prompts=toy", "n_prompts=2", "batch_size=2", "reference.window=4"]


def test_a_tiny_search_writes_a_row_a_budget_and_its_chosen_row_names_the_drafter_it_trained(tmp_path):
    out = tmp_path / "budgets.csv"
    train = f"train_overrides=[data.batch_size=2,data.cache={tmp_path / 'cache'},measure_images=2,threads=1]"
    cfg = search_config([*TINY, f"drafters={tmp_path / 'drafters'}", f"out={out}", train])
    table = search(cfg)
    written = pd.read_csv(out)
    assert list(zip(written["images"], written["epochs"])) == [(2, 1), (3, 1)]
    assert written["chosen"].sum() == 1 and written["n_prompts"].eq(2).all()
    assert written["published"].to_list() == pytest.approx([published_target(cfg)] * 2, rel=1e-5)
    ratio = written["reference_forwards"] / written["drafted_forwards"]
    assert written["steps_over_reference"].to_list() == pytest.approx(ratio.to_list(), rel=1e-5)
    assert written["accept_sampled"].between(0, 1).all()
    row = chosen_budget(written)
    assert abs(row["off_published"]) == written["off_published"].abs().min()
    assert table.loc[table["chosen"], "weights_sha"].iloc[0] == row["weights_sha"]

    def record(images: int) -> dict:
        return json.loads((tmp_path / "drafters" / f"micro_{images}x1" / "drafter.json").read_text())

    assert record_matches(row, record(int(row["images"]))) == []
    other = 3 if row["images"] == 2 else 2
    departs = record_matches(row, record(other))
    assert departs[0] == f"images: the row's {row['images']!r}, the record's {other!r}"
    assert any(d.startswith("recipe_sha:") for d in departs)


def test_a_rerun_keeps_the_rows_it_finished_and_decodes_only_the_budgets_it_lacks(tmp_path, monkeypatch):
    """A search killed after its first budget, rerun with both: the first row is kept as written (no decode, no
    training), the second decoded; a row of other settings (another seed) is decoded again."""
    import sjd.training.drafter_budgets as budgets

    out = tmp_path / "budgets.csv"
    train = f"train_overrides=[data.batch_size=2,data.cache={tmp_path / 'cache'},measure_images=2,threads=1]"
    common = [*TINY[2:], f"drafters={tmp_path / 'drafters'}", f"out={out}", train, "model=micro"]
    search(search_config([*common, "budgets=[[2,1]]"]))
    first = pd.read_csv(out)
    decoded = []
    real = budgets.forwards_per_image
    monkeypatch.setattr(budgets, "forwards_per_image", lambda *a: decoded.append(a[1].name) or real(*a))
    table = search(search_config([*common, "budgets=[[2,1],[3,1]]"]))
    assert decoded == ["sjd_official", "eagle_sampled"]  # the reference and the new budget only
    kept = table[table["images"] == 2].iloc[0]
    assert kept["decode_seconds"] == first["decode_seconds"].iloc[0]
    assert kept["steps_over_reference"] == pytest.approx(first["steps_over_reference"].iloc[0], rel=1e-5)
    decoded.clear()
    search(search_config([*common, "budgets=[[2,1]]", "seed=1"]))
    assert decoded == ["sjd_official", "eagle_sampled"]


def test_the_chosen_budget_is_the_one_nearest_the_published_figure():
    rows = pd.DataFrame({"images": [64, 32, 128], "epochs": [1, 1, 3], "off_published": [0.2, -0.5, -0.01]})
    rows = rows.reindex(columns=[*rows.columns, *(c for c in COLUMNS if c not in rows)])
    table = mark_chosen(rows)
    assert list(table["images"]) == [32, 64, 128] and list(table["chosen"]) == [False, False, True]
    with pytest.raises(ValueError, match="marks exactly one budget chosen; this one marks 0"):
        chosen_budget(table.assign(chosen=False))


def test_the_target_is_the_published_eagle_over_sjd():
    """Read from results/paper/published.csv: EAGLE's 2.94x over SJD's 2.22x on Lumina-mGPT (SJD-PAC's table)."""
    assert published_target(search_config([])) == pytest.approx(2.94 / 2.22)


@pytest.mark.parametrize(
    "override, error",
    [
        ("budget=[[2,1]]", "'budget=\\[\\[2,1\\]\\]': not a key=value override of a key in"),
        ("budgets=[[2,0]]", "budgets: each budget is \\[images, epochs\\], integers >= 1; got \\[2, 0\\]"),
        ("budgets=[[2,1],[2,1]]", "budgets must be distinct"),
        ("n_prompts=0", "n_prompts must be an integer >= 1, got 0"),
    ],
)
def test_bad_search_settings_are_named_before_anything_trains(override, error):
    with pytest.raises(ValueError, match=error):
        search_config([override])


def test_the_shipped_calibrated_drafter_is_a_budget_of_the_search_with_the_recipe_it_trains():
    """The shipped calibrated drafter's record names one of conf/drafter_budgets.yaml's budgets, and the recipe the
    search composes for that budget hashes to the record's recipe_sha: the search retrains that drafter's recipe."""
    from pathlib import Path

    from sjd.drafters.recipe import recipe_sha
    from sjd.training.drafter import recipe_arguments
    from sjd.training.drafter_budgets import train_overrides
    from sjd.training.drafter_checks import compose

    root = Path(__file__).resolve().parents[2]
    record = json.loads(
        (root / "sjd" / "assets" / "drafter_standin_lumina_512_cal_calibrated" / "drafter.json").read_text()
    )
    cfg = search_config([])
    budget = [record["recipe"]["data"]["n_images"], record["recipe"]["train"]["epochs"]]
    assert budget in cfg.budgets and budget == [128, 3]
    composed = compose(train_overrides(cfg, *budget))
    assert recipe_sha(recipe_arguments(composed)) == record["recipe_sha"]
    assert record_matches(pd.Series({"images": 128, "epochs": 3, "recipe_sha": record["recipe_sha"]}), record) == []


def test_the_committed_search_has_a_row_per_budget_and_the_shipped_calibrated_drafter_is_its_chosen_row():
    """results/drafter_budgets.csv, as `python -m sjd.training.drafter_budgets` wrote it: one row for each of
    conf/drafter_budgets.yaml's budgets, the one nearest the published figure chosen, and the shipped calibrated
    drafter's record naming that row's budget and recipe."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    table = pd.read_csv(root / "results" / "drafter_budgets.csv")
    cfg = search_config([])
    assert sorted(zip(table["images"], table["epochs"])) == sorted(tuple(b) for b in cfg.budgets)
    assert table["n_prompts"].eq(cfg.n_prompts).all() and table["seed"].eq(cfg.seed).all()
    assert table["published"].to_list() == pytest.approx([published_target(cfg)] * len(table), rel=1e-5)
    assert mark_chosen(table)["chosen"].to_list() == table["chosen"].to_list()  # nearest the published figure
    record = json.loads(
        (root / "sjd" / "assets" / "drafter_standin_lumina_512_cal_calibrated" / "drafter.json").read_text()
    )
    assert record_matches(chosen_budget(table), record) == []
