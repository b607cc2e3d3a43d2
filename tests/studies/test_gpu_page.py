"""studies/gpu_page.py: the GPU page sets each forward beside its bandwidth floor, lists the decodes by engine
and keeps a model's error."""

import pandas as pd
import pytest

from studies.gpu_page import decode_table, forward_table, render, render_gpu_page, weight_floor_ms

ENV = {"device_name": "NVIDIA H200", "dtype": "bfloat16", "torch": "2.11.0", "transformers": "5.24.0", "git": "abc",
       "command": "bash scripts/gpu_smoke.sh", "params_b": 7.2}  # fmt: skip


def rows() -> pd.DataFrame:
    forwards = [{**ENV, "model": "lumina", "measure": "forward", "context": 2293, "window": w, "median_ms": ms,
                 "ratio_vs_window1": ms / 6.0} for w, ms in ((1, 6.0), (16, 9.0))]  # fmt: skip
    decodes = [{**ENV, "model": "lumina", "measure": f"decode_{d}", "engine": e, "tokens": 200, "n_forward": n,
                "ms_per_token": ms, "ms_per_forward": ms * 200 / n, "vs_eager": v, "warmup_s": 1.0}
               for d, e, n, ms, v in (("ar", "eager_dynamic", 200, 40.0, 1.0), ("sjd16", "compiled_static", 190, 12.0,
                                                                                 3.3))]  # fmt: skip
    syncs = [{**ENV, "model": "lumina", "measure": "syncs_sjd16", "decoder_syncs_per_iter": 1.0,
              "forward_syncs_per_iter": 0.0}]  # fmt: skip
    failed = [{**ENV, "model": "emu3", "error": "OutOfMemoryError: CUDA out of memory"}]
    return pd.DataFrame([*forwards, *decodes, *syncs, *failed])


def test_the_floor_is_the_weights_read_once_at_the_datasheet_bandwidth():
    assert weight_floor_ms(4.8, "bfloat16", "NVIDIA H200") == pytest.approx(2.0)  # 9.6 GB at 4.8 TB/s
    assert weight_floor_ms(4.8, "float32", "NVIDIA H200") == pytest.approx(4.0)
    assert pd.isna(weight_floor_ms(4.8, "bfloat16", "a GPU nobody listed"))


def test_forwards_show_how_many_floors_they_took_and_decodes_their_engine():
    table = forward_table(rows()).set_index("window")
    assert table.loc[1, "floor_ms"] == pytest.approx(3.0) and table.loc[16, "x_floor"] == pytest.approx(3.0)
    decodes = decode_table(rows()).set_index("decoder")
    assert decodes.loc["sjd16", "engine"] == "compiled_static" and decodes.loc["ar", "ms_per_token"] == 40.0


def test_the_page_names_its_command_and_keeps_the_error(tmp_path):
    frame = rows()
    frame["error"] = frame.get("error")
    text = render(frame)
    assert "bash scripts/gpu_smoke.sh" in text and "NVIDIA H200" in text
    assert "| emu3 | OutOfMemoryError" in text
    frame.to_csv(tmp_path / "gpu_forward_latency.csv", index=False)
    assert render_gpu_page(tmp_path, tmp_path) == tmp_path / "gpu_forward_latency.md"
    assert render_gpu_page(tmp_path / "none", tmp_path) is None
