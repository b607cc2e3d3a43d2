"""The real-size study (sjd/bench/real_size.py, run by scripts/real_size.py) at tiny widths: each model's prefill
and first windows go through the real adapter on the static cache sized to the real layout, with both CFG rows, and
the CSV says so."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sjd.bench.real_size import real_size

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "real_size.py"


def test_the_prefill_and_the_first_windows_of_each_model_at_its_real_layout(tmp_path):
    out = tmp_path / "real_size.csv"
    real_size(["lumina", "janus"], windows=2, tiny=True, threads=None, out=out, command="python scripts/real_size.py")
    rows = pd.read_csv(out)
    assert list(dict.fromkeys(rows["model"])) == ["lumina", "janus"]
    assert "error" not in rows or rows["error"].isna().all()
    for model, got in rows.groupby("model"):
        first = got.iloc[0]
        assert list(got["forward"]) == ["prefill", "forward", "forward"], model  # stopped after 2 windows
        assert first["n_forward"] == 3 and first["committed"] >= 3
        slots = first["cache_prompt_slots"] + first["layout_tokens"] + first["cache_scratch_slots"] + 1
        assert first["cache_layer_shape"].split("x")[0] == "2" and first["cache_layer_shape"].split("x")[2] == str(
            slots
        )
        assert all(m.split("x")[0] == "2" and m.split("x")[-1] == str(slots) for m in got["mask"]), model
        assert all(t.split("x")[0] == "2" for t in got["trunk_in"]), model  # the conditional and the CFG row
        windows = got[got["forward"] == "forward"]
        assert (windows["tokens_in"] == "1x16").all()
        assert (windows["cond_logits"] == f"1x16x{first['vocab_size']}").all()
        assert (windows["uncond_logits"] == windows["cond_logits"]).all()
        assert first["peak_gb"] >= first["rss_after_build_gb"] > 0 and first["tiny"]
    assert rows["git_hash"].notna().all() and rows["command"].str.contains("real_size.py").all()


def test_an_unknown_model_is_refused_by_name(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--models", "lumina,dalle"], capture_output=True, text=True)
    assert proc.returncode == 2 and "dalle" in proc.stderr
    with pytest.raises(ValueError, match="dalle"):
        real_size(["lumina", "dalle"], windows=1, tiny=True, threads=None, out=tmp_path / "x.csv", command="")
