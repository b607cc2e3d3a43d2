"""The page of SSD's readings (studies.readings_page, conf/experiment/ssd_readings.yaml) from a small synthetic CSV:
every SSD row called our reading, its settings, speeds, excess nats and impossible tokens split by block row from the
rows, and the reading nearest the published figure read from the published table."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from studies.pages import render_all
from studies.readings_page import nearest_lines, readings_lines

COMMAND = "python run.py experiment=tiny_readings"
OVERLAY = f"""\
# @package _global_
experiment_name: tiny_readings
results_csv: results/studies/tiny_readings.csv
study:
  page: tiny_readings
  title: Tiny readings
  question: Which reading is which?
  commands:
    - {COMMAND}
  figure: readings
"""
READINGS = {  # name: (rounds, rows_below, window, step compression, modelled speedup, top-row share, below share)
    "ssd_r2_rows3_w5": (2, 2, 5, 7.0, 5.5, 0.01, 0.05),
    "ssd_r1_rows5_w8": (1, 4, 8, 14.0, 11.0, 0.02, 0.20),
}
PUBLISHED = pd.DataFrame(
    {"table": ["ssd_lumina"], "model": ["lumina"], "method": ["ssd"], "step_compression": [float("nan")],
     "latency_speedup": [12.0], "source": ["a summary of a paper"]}
)  # fmt: skip


def run_rows() -> pd.DataFrame:
    configs = {"ar": {"name": "ar"}, "sjd_official": {"name": "sjd_official", "window": 16}}
    configs |= {n: {"name": n, "rounds": r, "rows_below": b, "window": w, "context": w}
                for n, (r, b, w, *_) in READINGS.items()}  # fmt: skip
    classes = {"ar": "ARDecoder", "sjd_official": "SJDDecoder"} | dict.fromkeys(READINGS, "SSDDecoder")
    lossless = {"ar": True, "sjd_official": True} | dict.fromkeys(READINGS, False)
    common = {"model": "standin_lumina_512_cal", "prompt_set": "standin", "prompt_selection": "first 4 of 168",
              "batch_size": 1, "device": "cpu", "git_hash": "0123abcd", "config_fingerprint": "fp", "command": COMMAND,
              "baseline": "ar", "run_dir": "r", "decoder_configs": json.dumps(configs), "n_prompts": 4, "n_captions": 4,
              "decoder_classes": json.dumps(classes), "tf_var_nats2": 2.0, "tf_n_tokens": 4096,
              "decoder_lossless": json.dumps(lossless)}  # fmt: skip
    rows = [
        {**common, "decoder": "ar", "step_compression": 1.0, "modelled_speedup": 1.0, "tf_excess_nats": 0.001,
         "tf_zero_share": 0.0},
        {**common, "decoder": "sjd_official", "step_compression": 2.0, "modelled_speedup": 1.9,
         "tf_excess_nats": 0.0, "tf_zero_share": 0.0},
    ]  # fmt: skip
    for name, (_, _, _, steps, speed, top, below) in READINGS.items():
        rows.append(
            {**common, "decoder": name, "step_compression": steps, "step_compression_lo": steps - 0.5,
             "step_compression_hi": steps + 0.5, "modelled_speedup": speed, "modelled_speedup_lo": speed - 0.25,
             "modelled_speedup_hi": speed + 0.25, "modelled_speedup_range_lo": speed - 2,
             "modelled_speedup_range_hi": speed + 1, "tf_excess_nats": 0.1 * steps, "tf_zero_share": (top + below) / 2,
             "tf_zero_share_top_row": top, "tf_zero_share_rows_below": below}
        )  # fmt: skip
    return pd.DataFrame(rows)


def test_every_reading_is_called_ours_with_its_settings_speeds_and_split_from_the_rows():
    text = "\n".join(readings_lines(run_rows(), PUBLISHED))
    assert "Every SSD row here is **our reading** of the SSD paper" in text
    assert "`sjd_official`" not in text and "| `ar`" not in text  # only the SSD rows are readings
    # rounds, rows in flight (1 + rows_below), width; intervals over prompts; the cost model's range; the split, the
    # top row's share before the rows below's (a swap would put 20.00% before 2.00%)
    assert ("| `ssd_r1_rows5_w8` | 1 | 5 | 8 | 14.00 (13.50-14.50) | 11.00 (10.75-11.25) | 9.00-12.00 | 1.4000 | "
            "11.00% | 2.00% | 20.00% |") in text  # fmt: skip
    assert "| `ssd_r2_rows3_w5` | 2 | 3 | 5 | 7.00 (6.50-7.50) | 5.50 (5.25-5.75) | 3.50-6.50 | 0.7000 |" in text
    assert "in 2 of 2 readings the rows below a block's top row" in text


def test_the_nearest_reading_is_named_against_the_published_figure_from_its_table():
    text = "\n".join(nearest_lines(run_rows().iloc[2:], PUBLISHED))
    assert "The published figure is 12.00x, column `latency_speedup` of results/paper/published.csv" in text
    assert "Source: a summary of a paper." in text
    assert "- By step compression: `ssd_r1_rows5_w8` (our reading), 14.00x, 1.17 of the published figure." in text
    assert "- By modelled speedup: `ssd_r1_rows5_w8` (our reading), 11.00x, 0.92 of the published figure." in text
    nearer_low = PUBLISHED.assign(latency_speedup=8.0)
    assert "By step compression: `ssd_r2_rows3_w5`" in "\n".join(nearest_lines(run_rows().iloc[2:], nearer_low))
    other_model = PUBLISHED.assign(model="llamagen")
    assert "No published `ssd` figure" in "\n".join(nearest_lines(run_rows().iloc[2:], other_model))


def test_a_readings_study_page_draws_its_frontier_then_its_readings(tmp_path: Path):
    conf, results, out = tmp_path / "conf", tmp_path / "results", tmp_path / "docs"
    conf.mkdir()
    results.mkdir()
    (conf / "tiny_readings.yaml").write_text(OVERLAY)
    run_rows().to_csv(results / "tiny_readings.csv", index=False)
    render_all(results, conf, out)
    page = (out / "tiny_readings.md").read_text()
    assert f"`{COMMAND}`" in page and "![readings](tiny_readings_tiny_readings_0_readings.png)" in page
    assert (out / "tiny_readings_tiny_readings_0_readings.png").stat().st_size > 1000
    assert page.index("![readings]") < page.index("**our reading**")
    assert "The published figure is" in page  # from results/paper/published.csv
    assert "rows_below=4, rounds=1" in page  # the key table tells the readings apart by their settings
