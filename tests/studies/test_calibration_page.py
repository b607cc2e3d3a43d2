"""The stand-in calibration page: anchors, fractions of the published ratios, the verdict and the rebuild command."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pandas as pd
import pytest

from sjd.standin.recipes import DEFAULTS
from studies.calibration_page import calibration_section, published_anchors, rebuild_command
from studies.regime_page import PUBLISHED

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python run.py experiment=standin_calibration model.adapter.weights=/tmp/standin_cal_x"
TRAINING = {"family": "lumina", "resolution": 512, "noise": 0.05, "streak": 0.05, "streak_corr": 0.6, "vstreak": 0.0,
            "edge": 6.0, "tint": 0.0, "row_tint": 0.0, "steps": 200,
            "batch_size": 4, "lr": 0.003, "hidden": 64, "layers": 2, "heads": 4, "seed": 0, "codebook_seed": 0,
            "threads": 1, "recipe_sha": "abc", "weights_sha": "def"}  # fmt: skip


def run_rows(sjd: float, scd: float, pac: float, command: str = COMMAND, run_dir: str = "r1") -> pd.DataFrame:
    """One calibration run's summary rows with the given anchors (intervals at +-5%)."""
    rows = pd.DataFrame(
        {
            "decoder": ["ar", "sjd_official", "scd_official_w64", "sjd_pac_official_w64"],
            "step_compression": [1.0, sjd, sjd * scd, sjd * pac],
            "vs_sjd_official": [1 / sjd, float("nan"), scd, pac],
        }
    )
    for column in ("step_compression", "vs_sjd_official"):
        rows[f"{column}_lo"], rows[f"{column}_hi"] = rows[column] * 0.95, rows[column] * 1.05
    return rows.assign(model="standin_lumina_512", baseline="ar", entropy_nats=5.0, command=command,
                       run_dir=run_dir, model_training=json.dumps(TRAINING))  # fmt: skip


def test_a_stand_in_at_the_published_ratios_is_calibrated_and_one_past_15_percent_is_not():
    published = pd.read_csv(PUBLISHED)
    theirs = published_anchors(published)
    assert theirs["SJD over AR"] == pytest.approx(2.22) and theirs["SCD over SJD"] == pytest.approx(4.22 / 2.22, 1e-2)
    at = run_rows(theirs["SJD over AR"], theirs["SCD over SJD"], theirs["SJD-PAC over SJD"])
    text = "\n".join(calibration_section(at, [COMMAND], published))
    assert "| 1.00 (0.95-1.05) |" in text and "is calibrated (every anchor's interval" in text
    assert ") | calibrated |" in text
    off = run_rows(theirs["SJD over AR"], theirs["SCD over SJD"] * 1.3, theirs["SJD-PAC over SJD"], run_dir="r2")
    text = "\n".join(calibration_section(pd.concat([at, off]), [COMMAND], published))  # the latest run counts
    assert "is not calibrated: SCD over SJD 1.30 (1.24-1.37) of published, outside the band." in text
    assert "| not calibrated |" in text and ") | calibrated |" not in text  # the earlier run is not shown


def test_an_anchor_whose_interval_crosses_the_band_leaves_the_verdict_open():
    """1.12 of published with an interval to 1.18 (the 768 px stand-in's SCD anchor, once): its point estimate
    is inside the band, but the interval reaches past it, so the page says not distinguishable at this size."""
    published = pd.read_csv(PUBLISHED)
    theirs = published_anchors(published)
    near = run_rows(theirs["SJD over AR"], theirs["SCD over SJD"] * 1.12, theirs["SJD-PAC over SJD"])
    text = "\n".join(calibration_section(near, [COMMAND], published))
    assert "is not distinguishable at this size: SCD over SJD 1.12 (1.06-1.18) of published, crossing" in text
    assert "| not distinguishable at this size |" in text


def test_the_page_prints_the_command_that_rebuilds_an_unshipped_checkpoint_from_its_record():
    text = "\n".join(calibration_section(run_rows(2.0, 2.0, 2.0), [COMMAND], pd.read_csv(PUBLISHED)))
    command = rebuild_command(TRAINING, "/tmp/standin_cal_x")
    assert command in text
    assert command == ("python scripts/train_standin.py --custom standin_cal_x --noise 0.05 --streak 0.05 "
                       "--streak-corr 0.6 --out /tmp/standin_cal_x")  # fmt: skip
    words = shlex.split(command)[4:-2]  # the recipe's options, after --custom NAME and before --out
    given = {words[i][2:].replace("-", "_"): words[i + 1] for i in range(0, len(words), 2)}
    rebuilt = {k: type(v)(given.get(k, v)) for k, v in DEFAULTS.items()}
    assert rebuilt == {k: TRAINING[k] for k in DEFAULTS}  # the command gives the recorded recipe back
    wide = rebuild_command(TRAINING | {"hidden": 128, "heads": 8, "family": "llamagen"}, "/tmp/w")
    assert wide.endswith(
        "--family llamagen --noise 0.05 --streak 0.05 --streak-corr 0.6 --hidden 128 --heads 8 --out /tmp/w"
    )
