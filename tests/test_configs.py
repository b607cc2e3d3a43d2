"""Every model x decoder composes; unknown names get Hydra's own error listing the options."""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra.utils import get_class, instantiate

ROOT = Path(__file__).resolve().parents[1]
MODELS = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
DECODERS = sorted(p.stem for p in (ROOT / "conf" / "decoder").glob("*.yaml"))
EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("decoder", DECODERS)
def test_every_model_and_decoder_composes(compose_cfg, model, decoder):
    cfg = compose_cfg([f"model={model}", f"decoder={decoder}"])
    assert cfg.model.name == model and cfg.decoder.name == decoder
    assert cfg.baseline.name == "ar"
    d = instantiate(cfg.decoder)
    assert d.name == decoder


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_builds_its_decoders(compose_cfg, experiment):
    from sjd.runner import build_decoders

    cfg = compose_cfg([f"experiment={experiment}"])
    assert cfg.experiment_name == experiment
    decoders, baseline = build_decoders(cfg)
    assert baseline == "ar" and decoders[0].name == "ar"


def test_default_config_is_toy_sjd_against_ar(compose_cfg):
    cfg = compose_cfg()
    assert (cfg.model.name, cfg.decoder.name, cfg.baseline.name, cfg.prompts.name) == ("toy", "sjd", "ar", "toy")
    get_class(cfg.model.adapter._target_)


@pytest.mark.parametrize("group, name", [("model", "nosuchmodel"), ("decoder", "nosuchdecoder")])
def test_unknown_names_list_the_options(group, name):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), f"{group}={name}"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode != 0
    assert f"Could not find '{group}/{name}'" in proc.stderr
    assert "Available options" in proc.stderr and ("toy" in proc.stderr or "sjd" in proc.stderr)
