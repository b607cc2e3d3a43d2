"""A decoder's name means one config: across every study command of conf/experiment/, two rows of the same name
decode with the same settings, whatever overlay runs them. What may differ is what a row records beside its name:
the window (and EAGLE's `total_tokens`, its window), and the drafter's or heads' weights, which follow the model.
The committed results CSVs hold no row renamed since (studies/row_names.py, which
scripts/name_rows_by_settings.py runs)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from studies.regime import sample_settings
from studies.row_names import STUDY_CSVS, renamed

ROOT = Path(__file__).resolve().parents[2]
PER_ROW = ("window", "total_tokens")  # recorded in every row beside the name
FOLLOWS_THE_MODEL = ("drafter", "heads")  # their weights: the model config's own

STUDY_COMMANDS = [
    command
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml"))
    if (study := OmegaConf.load(path).get("study"))
    for command in study.get("commands", [])
]


def what_decides(config: dict) -> str:
    settings = {k: v for k, v in sample_settings(config).items() if k not in PER_ROW}
    for part in FOLLOWS_THE_MODEL:
        if isinstance(settings.get(part), dict):
            settings[part] = {k: v for k, v in settings[part].items() if k not in ("weights", "record")}
    return json.dumps(settings, sort_keys=True, default=str)


def run_decoders(cfg) -> list[dict]:
    nodes = [cfg.decoder, *([cfg.baseline] if cfg.get("baseline") is not None else [])]
    nodes += list(cfg.get("extra_decoders") or []) + list((cfg.get("named_decoders") or {}).values())
    return [OmegaConf.to_container(n, resolve=True) for n in nodes]


def test_a_decoder_name_means_one_config_in_every_study(compose_cfg):
    seen: dict[str, dict[str, str]] = defaultdict(dict)
    for command in STUDY_COMMANDS:
        for config in run_decoders(compose_cfg(command.split()[2:])):
            seen[config["name"]].setdefault(what_decides(config), command)
    clashes = {name: list(by.values()) for name, by in seen.items() if len(by) > 1}
    assert not clashes, "one name, several configs (give each its own name in its overlay): " + json.dumps(
        clashes, indent=1
    )


def test_the_committed_results_hold_no_row_under_another_configs_name():
    """What `scripts/name_rows_by_settings.py --check` checks (studies.row_names.renamed), on every committed CSV."""
    pending = {}
    for path in sorted(STUDY_CSVS.glob("*.csv")):
        _, changes = renamed(pd.read_csv(path, low_memory=False))
        if changes:
            pending[path.name] = changes
    assert not pending, "rename them with python scripts/name_rows_by_settings.py: " + json.dumps(pending, indent=1)
