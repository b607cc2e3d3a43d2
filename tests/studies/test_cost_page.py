"""The cost page: every engine of the cost model checked against the published latencies over its range, beside two
models that know nothing of the GPU; an engine that does no better than them is not validated."""

from pathlib import Path

import pandas as pd
import pytest

from studies.cost_page import (
    BAND,
    BYTES_ONLY,
    CONSTANT,
    best_constant,
    cost_section,
    model_scores,
    score,
)
from studies.regime_page import PUBLISHED

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED_EFFICIENCY = pd.Series({"a": 0.92, "b": 1.0, "c": 0.84, "d": 0.71, "e": 0.72})


def test_a_model_equal_to_a_constant_efficiency_is_not_validated():
    constant = best_constant(PUBLISHED_EFFICIENCY)
    points = {
        CONSTANT: pd.Series(constant, index=PUBLISHED_EFFICIENCY.index),
        BYTES_ONLY: pd.Series([1.0, 1.0, 1.0, 0.73, 0.73], index=PUBLISHED_EFFICIENCY.index),
        "same as the constant": pd.Series(constant, index=PUBLISHED_EFFICIENCY.index),
        "every anchor": PUBLISHED_EFFICIENCY + 0.01,
    }
    verdicts = model_scores(points, PUBLISHED_EFFICIENCY).set_index("model")["verdict"]
    assert verdicts["same as the constant"] == "not validated"
    assert verdicts["every anchor"] == "validated"
    assert verdicts[CONSTANT] == verdicts[BYTES_ONLY] == "a trivial model"


def test_the_constant_is_the_strongest_one_on_the_anchors_themselves():
    """The trivial constant has the most anchors within the band there are, and among those the smallest error."""
    constant = best_constant(PUBLISHED_EFFICIENCY)
    mine = score(pd.Series(constant, index=PUBLISHED_EFFICIENCY.index), PUBLISHED_EFFICIENCY)
    for other in (0.5, 0.8, 0.9, 0.93, 1.0):
        theirs = score(pd.Series(other, index=PUBLISHED_EFFICIENCY.index), PUBLISHED_EFFICIENCY)
        assert mine[0] > theirs[0] or (mine[0] == theirs[0] and mine[1] <= theirs[1])
    assert mine[0] == 3 and abs(constant - 0.84) <= BAND  # a band of 0.1 holds at most three of these anchors


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    results = pd.read_csv(ROOT / "results" / "studies" / "cost_validation.csv")
    commands = ["python run.py experiment=cost_validation"]
    return "\n".join(cost_section(results, commands, pd.read_csv(PUBLISHED), tmp_path_factory.mktemp("tables")))


def test_the_page_counts_the_anchors_that_ran_and_scores_every_engine_beside_the_trivial_models(page):
    """On the recorded run: SJD2's anchor is not run, so five ran; each engine and both trivial models are scored,
    each engine's verdict over its range is shown, and the fit on our own GPU leads the page."""
    assert "5 anchors ran (`sjd2` not run" in page and "6 anchors" not in page
    for model in (CONSTANT, BYTES_ONLY, "eager", "compiled", "graphed"):
        assert f"| {model} |" in page
    table = page[page.index("| model | anchors within the band") :].split("\n\n")[0]
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    assert all(rows[e].rstrip(" |").endswith(("validated", "not validated")) for e in ("eager", "compiled", "graphed"))
    assert page.index("## The constants fitted on our GPU") < page.index("## The cost model against")
    assert "decided by the cost model over its range" in page
