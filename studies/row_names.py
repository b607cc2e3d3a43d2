"""Rename results rows whose decoder ran under a name that now means another config, to the name its overlay gives
that config today (RULES: a name, a setting whose recorded value makes it another config, and that config's name);
`scripts/name_rows_by_settings.py` is its command line:

- a row named after an official sampler (`sjd_official`, `scd_official`, `sjd_pac_official`: random drafts at
  grammar-forced slots too, forced_drafts false) recorded with the harness's forced drafts -> `<name>_forced`;
- ZipAR at a context other than its own 16 -> `zipar_c<context>`;
- `sjd_block` (vertical_dist drafts) recorded with random drafts -> `sjd_random_block`.

Everywhere its run records the name: the `decoder` cell, the keys of `decoder_configs` and `decoder_lossless` (and
the config's own `name`), and the ratio columns to it (`vs_<name>`, `fe_vs_<name>`, `modelled_vs_<name>` and their
intervals, moved to the new name's columns). Only names change; every number stays in its row.
tests/project/test_decoder_names.py holds the committed CSVs to having nothing left to rename.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
STUDY_CSVS = ROOT / "results" / "studies"
RULES = (  # (name, setting, recorded value, the name of that config)
    *((name, "forced_drafts", True, f"{name}_forced") for name in ("sjd_official", "scd_official", "sjd_pac_official")),
    ("zipar", "context", 8, "zipar_c8"),
    ("zipar", "context", 4, "zipar_c4"),
    ("sjd_block", "init", "random", "sjd_random_block"),
)


def new_names(configs: dict) -> dict[str, str]:
    """old name -> new name for the decoders of one run whose recorded config a rule renames."""
    out = {}
    for name, key, value, new in RULES:
        config = configs.get(name)
        if isinstance(config, dict) and key in config and config[key] == value and type(config[key]) is type(value):
            out[name] = new
    return out


def ratio_columns(columns: list[str], name: str, new: str) -> dict[str, str]:
    """Ratio columns to decoder `name` -> the same columns to `new`."""
    pattern = re.compile(rf"^((?:fe_|modelled_|modelled_eager_)?vs_){re.escape(name)}(_lo|_hi)?$")
    out = {}
    for column in columns:
        match = pattern.match(column)
        if match:
            out[column] = f"{match.group(1)}{new}{match.group(2) or ''}"
    return out


def rename_keys(cell: object, renames: dict[str, str], set_name: bool) -> object:
    if not isinstance(cell, str) or not cell.startswith("{"):
        return cell
    record = json.loads(cell)
    out = {}
    for key, value in record.items():
        new = renames.get(key, key)
        if set_name and isinstance(value, dict) and key in renames:
            value = {**value, "name": new}
        out[new] = value
    return json.dumps(out, sort_keys=True)


def renamed(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The table with each run's rows renamed by RULES, and what changed."""
    if "decoder_configs" not in table or "run_dir" not in table:
        return table, []
    table = table.copy()
    for column in ("decoder", "decoder_configs", "decoder_lossless"):
        if column in table:
            table[column] = table[column].astype(object)  # cells may be rewritten with NaN beside text
    changes = []
    for run_dir, rows in table.groupby("run_dir", sort=False):
        configs = json.loads(rows["decoder_configs"].dropna().iloc[0]) if rows["decoder_configs"].notna().any() else {}
        renames = new_names(configs)
        if not renames:
            continue
        index = rows.index
        table.loc[index, "decoder"] = [renames.get(d, d) for d in rows["decoder"]]
        table.loc[index, "decoder_configs"] = [rename_keys(c, renames, True) for c in rows["decoder_configs"]]
        if "decoder_lossless" in table:
            table.loc[index, "decoder_lossless"] = [rename_keys(c, renames, False) for c in rows["decoder_lossless"]]
        for old, name in renames.items():
            for column, new in ratio_columns(list(table.columns), old, name).items():
                if new not in table:
                    table[new] = float("nan")
                table.loc[index, new] = table.loc[index, column]
                table.loc[index, column] = float("nan")
        changes.append(f"{run_dir}: {', '.join(f'{a} -> {b}' for a, b in renames.items())}")
    return table, changes


def rename_files(paths: list[Path], write: bool) -> bool:
    """Rename the rows of each CSV (rewritten in place when `write`), printing what changes; whether any would."""
    pending = False
    for path in paths:
        table = pd.read_csv(path, low_memory=False)
        out, changes = renamed(table)
        if not changes:
            continue
        pending = True
        print(f"{path}: {len(changes)} run(s)")
        for line in changes:
            print(f"  {line}")
        if write:
            out.to_csv(path, index=False)
    return pending
