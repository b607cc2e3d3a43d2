"""Bad input at start-up is refused naming its config key, before any model loads: values of the wrong
type or range, unknown settings, and a device this machine does not have."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sjd.harness.config_check import ConfigError, accepts, check_device, check_run_config

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
BAD = [
    ("seed=abc", "seed='abc': expected an integer"),
    ("batch_size=x", "batch_size='x': expected an integer"),
    ("batch_size=0", "batch_size=0: must be >= 1"),
    ("warmup=-1", "warmup=-1: must be >= 0"),
    ("cache=paged", "cache='paged': must be dynamic or static"),
    ("compile=true warmup=0", "compile=true needs warmup >= 1"),
    ("compile_mode=fast", "compile_mode='fast': must be default, reduce-overhead or max-autotune"),
    ("dist_timeout_min=0", "dist_timeout_min=0: must be > 0"),
    ("save_images=maybe", "save_images='maybe': expected true/false"),
    ("decoder.window=abc", "decoder.window='abc': expected an integer (SJDDecoder.window)"),
    ("baseline.name=3", "baseline.name=3: expected a string (ARDecoder.name)"),
    ("prompts.n=abc", "prompts.n='abc': expected an integer or null"),
    ("model.sampling.top_k=x", "model.sampling.top_k='x': expected an integer or null"),
    ("model.adapter.weights=5", "model.adapter.weights=5: expected a string or null (ToyAdapter.weights)"),
    ("+decoder.windw=4", "decoder.windw: SJDDecoder has no setting 'windw'"),
]


@pytest.fixture
def no_model_load(monkeypatch):
    """Reaching the model (built first thing in _run_rank) fails the test: every check must come before it."""
    import sjd.harness.runner

    def refuse(*args, **kwargs):
        raise AssertionError("the run went on to load the model before the config was checked")

    monkeypatch.setattr(sjd.harness.runner, "_run_rank", refuse)


@pytest.mark.parametrize(("override", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_is_refused_naming_its_key_before_the_model_loads(compose_cfg, no_model_load, tmp_path,
                                                                      override, message):  # fmt: skip
    from sjd.harness.runner import run

    cfg = compose_cfg([*override.split(), "results_csv=null"])
    with pytest.raises(ConfigError) as err:
        run(cfg, tmp_path / "run")
    assert message in str(err.value)
    assert not (tmp_path / "run").exists()  # nothing written either


def test_every_problem_is_listed_at_once(compose_cfg):
    with pytest.raises(ConfigError) as err:
        check_run_config(compose_cfg(["seed=abc", "decoder.window=abc"]))
    assert "seed='abc'" in str(err.value) and "decoder.window='abc'" in str(err.value)


class NoCuda:
    @staticmethod
    def is_available():
        return False

    @staticmethod
    def device_count():
        return 0


class TwoGPUs:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def device_count():
        return 2


def test_a_missing_cuda_device_says_what_was_asked_and_what_was_found():
    with pytest.raises(ConfigError, match=r"device=cuda: a CUDA device was asked for, but none is available here "
                                          r"\(torch .*; 0 GPU\(s\) visible\). Use device=cpu"):  # fmt: skip
        check_device("cuda", NoCuda)
    with pytest.raises(ConfigError, match=r"device=cuda:2: only 2 GPU\(s\) are visible"):
        check_device("cuda:2", TwoGPUs)
    check_device("cuda:1", TwoGPUs)
    check_device("cpu", NoCuda)
    check_device("auto", NoCuda)
    with pytest.raises(ConfigError, match="device='gpu0' is not a torch device"):
        check_device("gpu0", NoCuda)


def test_run_py_device_cuda_without_cuda_fails_at_once_naming_the_key(tmp_path):
    no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # a GPU machine too has none visible, then
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), "device=cuda", f"hydra.run.dir={tmp_path}/run",
                           "results_csv=null"], capture_output=True, text=True, cwd=tmp_path, env=no_gpu)  # fmt: skip
    assert proc.returncode != 0
    assert "device=cuda: a CUDA device was asked for, but none is available here" in proc.stderr
    assert "Torch not compiled with CUDA enabled" not in proc.stderr


def test_every_shipped_config_passes(compose_cfg):
    choices = [f"{group}={p.stem}" for group in ("experiment", "decoder", "model", "prompts", "logger")
               for p in sorted((CONF / group).glob("*.yaml"))]  # fmt: skip
    for choice in choices:
        check_run_config(compose_cfg([choice]))


def test_type_hints_are_matched_as_yaml_values():
    assert accepts(int, 3) and not accepts(int, True) and not accepts(int, 3.0) and not accepts(int, "3")
    assert accepts(float, 3) and accepts(float, 0.5) and not accepts(float, "0.5")
    assert accepts(int | None, None) and not accepts(str, None)
    assert accepts(list[int], [1]) and not accepts(list[int], "1") and accepts(dict, {"a": 1})
    assert accepts(Path, "a/b") and accepts(object, "anything")


def test_a_value_left_to_the_user_is_left_to_whoever_reads_it():
    from sjd.decoders.sjd import SJDDecoder
    from sjd.harness.config_check import check_settings

    assert check_settings("decoder", {"window": "???"}, SJDDecoder.__init__) == []  # `???`: MISSING, not a type error
    assert check_settings("decoder", {"window": "4"}, SJDDecoder.__init__) == [
        "decoder.window='4': expected an integer (SJDDecoder.window)"
    ]
