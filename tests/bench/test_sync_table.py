"""The reference sync table joins counts made by several commands: rows of a later command replace those with
the same key and keep the rest (sjd/bench/sync_table.py)."""

from __future__ import annotations

import pandas as pd

from sjd.bench.sync_table import merged_into


def rows(*items: tuple[str, str, int | None, float, str]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"decoder": d, "cache": c, "kernels": "eager", "window": w, "batch": 1, "syncs_per_iter": s, "command": cmd}
         for d, c, w, s, cmd in items]
    )  # fmt: skip


def test_merged_rows_replace_their_key_and_keep_the_others(tmp_path):
    path = tmp_path / "syncs.csv"
    rows(("sjd", "static", 16, 2.0, "all"), ("hawk", "static", 16, 9.0, "all"), ("ar", "static", None, 0.5, "all"),
         ("eagle", "static", None, 3.0, "all")).to_csv(path, index=False)  # fmt: skip
    # read back, a window is 16.0 or NaN; just counted, 16 or None: the same keys
    newer = rows(
        ("hawk", "static", 13, 1.0, "hawk"), ("sjd", "static", 16, 1.0, "again"), ("ar", "static", None, 0.0, "x")
    )
    out = merged_into(newer, path)
    got = {(r.decoder, -1 if pd.isna(r.window) else r.window): (r.syncs_per_iter, r.command) for r in out.itertuples()}
    assert got == {("ar", -1): (0.0, "x"), ("eagle", -1): (3.0, "all"), ("hawk", 16): (9.0, "all"),
                   ("hawk", 13): (1.0, "hawk"), ("sjd", 16): (1.0, "again")}  # fmt: skip
    assert len(out) == 5 and list(out["decoder"]) == sorted(out["decoder"])


def test_without_a_file_the_table_is_written_as_it_is(tmp_path):
    table = rows(("sjd", "static", 16, 1.0, "x"))
    assert merged_into(table, tmp_path / "none.csv") is table
