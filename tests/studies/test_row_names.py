"""Renaming results rows recorded under a name that now means another config (studies/row_names.py, run by
scripts/name_rows_by_settings.py): each rule renames its run's rows, configs and ratio columns, and no number moves
out of its row."""

import json

import pandas as pd

from studies.row_names import rename_files, renamed


def run_rows(run_dir: str, configs: dict) -> list[dict]:
    return [{"run_dir": run_dir, "decoder": name, "decoder_configs": json.dumps(configs, sort_keys=True),
             "decoder_lossless": json.dumps({k: True for k in configs}, sort_keys=True), "vs_sjd_official": 1.5,
             "vs_sjd_official_lo": 1.2, "fe_vs_zipar": 2.0, "latency_s": 0.25 + i}
            for i, name in enumerate(configs)]  # fmt: skip


TABLE = pd.DataFrame(
    run_rows("forced", {"sjd_official": {"name": "sjd_official", "forced_drafts": True}, "ar": {"name": "ar"}})
    + run_rows("zipar8", {"zipar": {"name": "zipar", "context": 8}, "ar": {"name": "ar"}})
    + run_rows("as_named", {"zipar": {"name": "zipar", "context": 16}, "ar": {"name": "ar"}})
    + run_rows("random_block", {"sjd_block": {"name": "sjd_block", "init": "random"}})
)


def test_each_rule_renames_its_runs_rows_and_leaves_every_number_in_its_row():
    out, changes = renamed(TABLE)
    assert changes == ["forced: sjd_official -> sjd_official_forced", "zipar8: zipar -> zipar_c8",
                       "random_block: sjd_block -> sjd_random_block"]  # fmt: skip
    assert list(out.decoder) == ["sjd_official_forced", "ar", "zipar_c8", "ar", "zipar", "ar", "sjd_random_block"]
    configs = json.loads(out.decoder_configs[0])
    assert configs["sjd_official_forced"] == {"name": "sjd_official_forced", "forced_drafts": True}
    assert set(json.loads(out.decoder_lossless[2])) == {"zipar_c8", "ar"}
    forced, zipar8, as_named = (out.run_dir == r for r in ("forced", "zipar8", "as_named"))
    assert (out.vs_sjd_official_forced[forced] == 1.5).all() and out.vs_sjd_official[forced].isna().all()
    assert (out.vs_sjd_official_forced_lo[forced] == 1.2).all() and out.vs_sjd_official_lo[forced].isna().all()
    assert (out.fe_vs_zipar_c8[zipar8] == 2.0).all() and (out.fe_vs_zipar[as_named] == 2.0).all()
    assert out.latency_s.tolist() == TABLE.latency_s.tolist()


def test_a_file_is_rewritten_only_when_asked(tmp_path, capsys):
    path = tmp_path / "study.csv"
    TABLE.to_csv(path, index=False)
    assert rename_files([path], write=False) and "3 run(s)" in capsys.readouterr().out
    assert pd.read_csv(path).decoder.tolist() == TABLE.decoder.tolist()
    assert rename_files([path], write=True)
    assert not rename_files([path], write=False)  # nothing left to rename
