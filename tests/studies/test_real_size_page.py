"""studies/real_size_page.py: the real-size page shows each model's memory and shapes, or the error it met."""

import pandas as pd

from studies.real_size_page import model_table, render, render_real_size_page

ENV = {"command": "python scripts/real_size.py", "git_hash": "abc", "torch": "2.13.0", "transformers": "5.24.0",
       "dtype": "bfloat16", "threads": 2, "tiny": False}  # fmt: skip
FACTS = {"model": "lumina", "params_b": 7.0, "weights_gb": 13.0, "layout_tokens": 2357, "vocab_size": 65536,
         "cache_layer_shape": "2x32x2748x128", "cache_gb": 2.7, "rss_after_build_gb": 13.5, "peak_gb": 17.0,
         "build_s": 60.0, "n_forward": 4, "committed": 9, "window": 16, "windows": 3}  # fmt: skip


def rows() -> pd.DataFrame:
    forwards = [("prefill", "", "2x134", 20.0), *[("forward", "1x16", "2x16", s) for s in (4.0, 5.0, 6.0)]]
    ok = [{**ENV, **FACTS, "step": i, "forward": kind, "tokens_in": tokens, "trunk_in": trunk, "mask": "m",
           "cond_logits": "1x16x65536", "uncond_logits": "1x16x65536", "seconds": s}
          for i, (kind, tokens, trunk, s) in enumerate(forwards)]  # fmt: skip
    failed = {**ENV, "model": "emu3", "error": "exit -9: killed (SIGKILL: out of memory?)"}
    return pd.DataFrame([*ok, failed])


def test_one_line_per_model_with_its_seconds_or_its_error():
    table = model_table(rows()).set_index("model")
    assert table.loc["lumina", "runs"] == "yes" and table.loc["emu3", "runs"] == "no"
    assert table.loc["lumina", "prefill_s"] == 20.0 and table.loc["lumina", "s_per_window"] == 5.0
    assert "out of memory" in table.loc["emu3", "error"]


def test_the_page_names_its_command_and_lists_every_forward(tmp_path):
    text = render(rows())
    assert "python scripts/real_size.py" in text and "first 3 windows" in text and "window 16" in text
    assert sum(line.startswith("| lumina | ") for line in text.splitlines()) == 1 + 4  # its line, its 4 forwards
    assert "tiny widths" not in text
    rows().to_csv(tmp_path / "real_size.csv", index=False)
    assert render_real_size_page(tmp_path, tmp_path) == tmp_path / "real_size.md"
    assert render_real_size_page(tmp_path / "none", tmp_path) is None
