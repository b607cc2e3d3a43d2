"""The draft heads' held-out acceptance on a run's page (studies.heads_acceptance), read from the heads records a
run keeps in its decoder configs."""

import json
from pathlib import Path

import pandas as pd

from studies.heads_acceptance import heads_acceptance_lines

ROOT = Path(__file__).resolve().parents[2]


def run_rows(configs: dict) -> pd.DataFrame:
    return pd.DataFrame({"decoder": list(configs), "decoder_configs": json.dumps(configs)})


def record(tokens: bool, first: float) -> dict:
    measured = {"images": 8, "acceptance": {"1": first, "2": 0.5}, "untrained": {"1": 0.6, "2": 0.45}}
    return {"measured": measured, **({"tokens": True} if tokens else {})}


def test_each_heads_directory_is_listed_once_with_its_kind_and_acceptance_beside_untrained():
    rows = run_rows({
        "ar": {"name": "ar"},
        "a": {"heads": {"weights": "heads/plain", "record": record(False, 0.7)}},
        "b": {"heads": {"weights": "heads/plain", "record": record(False, 0.7)}},
        "c": {"heads": {"weights": "heads/tokens", "record": record(True, 0.8)}},
        "d": {"heads": {"weights": "random", "record": {"random_seed": 0}}},
    })  # fmt: skip
    lines = heads_acceptance_lines(rows)
    assert "- `heads/plain` (feature only; 8 held-out images): +1: 0.700 (0.600), +2: 0.500 (0.450)." in lines
    assert "- `heads/tokens` (feature and token; 8 held-out images): +1: 0.800 (0.600), +2: 0.500 (0.450)." in lines
    assert sum(line.startswith("- ") for line in lines) == 2  # random heads have no measured acceptance
    assert heads_acceptance_lines(run_rows({"ar": {"name": "ar"}})) == []


def test_the_heads_page_shows_the_shipped_heads_record_it_decoded_with():
    record = json.loads((ROOT / "sjd" / "assets" / "heads_standin_lumina_512_cal" / "heads.json").read_text())
    first = record["measured"]["acceptance"]["1"]
    text = (ROOT / "docs" / "results" / "heads.md").read_text()
    assert f"- `sjd/assets/heads_standin_lumina_512_cal` (feature only; 8 held-out images): +1: {first:.3f}" in text


def test_the_page_lists_the_shipped_heads_of_the_models_its_runs_read_heads_on(tmp_path):
    from studies.heads_acceptance import shipped_heads_lines

    for name, target, tokens in (("heads_m", "m", False), ("token_heads_m", "m", True), ("heads_other", "o", False)):
        (tmp_path / "sjd" / "assets" / name).mkdir(parents=True)
        heads = {"target": {"name": target}, "command": f"python scripts/train_heads.py model={target}",
                 **record(tokens, 0.8 if tokens else 0.7)}  # fmt: skip
        (tmp_path / "sjd" / "assets" / name / "heads.json").write_text(json.dumps(heads))
    rows = run_rows({"a": {"heads": {"weights": "sjd/assets/heads_m", "record": record(False, 0.7)}}})
    lines = shipped_heads_lines(rows.assign(model="m", run_dir="r1"), tmp_path)
    listed = [line for line in lines if line.startswith("- ")]
    assert listed == [
        "- `sjd/assets/heads_m` (feature only; 8 held-out images): +1: 0.700 (0.600), +2: 0.500 (0.450). "
        "Trained by `python scripts/train_heads.py model=m`.",
        "- `sjd/assets/token_heads_m` (feature and token; 8 held-out images): +1: 0.800 (0.600), +2: 0.500 (0.450). "
        "Trained by `python scripts/train_heads.py model=m`.",
    ]
    plain = run_rows({"ar": {"name": "ar"}}).assign(model="m", run_dir="r1")
    assert shipped_heads_lines(plain, tmp_path) == []  # no run read trained heads
