"""The one loader every adapter uses (sjd/models/loading.py): which config values are a local checkpoint,
which a hub id, which are refused before anything loads, and how `model.adapter.dtype` is read."""

import pytest
import torch

from sjd.models.loading import resolve_checkpoint, torch_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_auto_and_null_mean_bfloat16_on_a_gpu_and_float32_on_the_cpu():
    assert torch_dtype("auto", CPU) is torch.float32 and torch_dtype(None, CPU) is torch.float32
    assert torch_dtype("auto", CUDA) is torch.bfloat16 and torch_dtype(None, CUDA) is torch.bfloat16
    assert torch_dtype("float16", CPU) is torch.float16 and torch_dtype("bfloat16", CPU) is torch.bfloat16
    with pytest.raises(ValueError, match=r"model\.adapter\.dtype must be auto or one of .*'fp8'"):
        torch_dtype("fp8", CPU)


def test_a_checkpoint_directory_needs_its_config_and_safetensors(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"\(Title\): .*ckpt holds no config\.json.*model\.adapter\.weights"):
        resolve_checkpoint(folder, "m", "Title")
    (folder / "config.json").write_text("{}")
    assert resolve_checkpoint(folder, "m", "Title") == (str(folder), True)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"safetensors"):
        resolve_checkpoint(folder, "m", "Title", key="model.adapter.t5")


def test_only_an_owner_repo_that_is_no_local_path_is_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_checkpoint("owner/repo", "m", "Title") == ("owner/repo", False)
    (tmp_path / "file").write_text("")
    (tmp_path / "local").mkdir()
    for value in ("./owner/repo", "~/no/such", str(tmp_path / "absent"), "file", "local/repo", "no-slash"):
        with pytest.raises(FileNotFoundError, match=r"'m' \(Title\).*not found.*`model\.adapter\.t5`.*e\.g\. a/b"):
            resolve_checkpoint(value, "m", "Title", key="model.adapter.t5", hub_example="a/b")
