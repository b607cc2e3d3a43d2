"""docs/adding-a-decoder.md's skeletons run as written: each Python block is loaded as the module its heading
names, each YAML block is built the way the runner builds a decoder, and an exact skeleton equals greedy AR token
for token on the toy."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.harness.config_check import check_settings
from sjd.harness.prompts import load_prompt_file
from sjd.models.toy import ToyAdapter

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "adding-a-decoder.md").read_text()
MODULES = dict(re.findall(r"`sjd/decoders/(\w+)\.py`:\n\n```python\n(.*?)```", PAGE, re.S))
CONFIGS = {
    yaml.safe_load(block)["name"]: block
    for block in re.findall(r"```yaml\n(.*?)```", PAGE, re.S)
    if "_target_:" in block
}
PROMPTS = load_prompt_file(ROOT / "sjd/assets/prompts/toy.tsv")[:3]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)


def test_the_page_has_its_three_skeletons_and_their_configs():
    assert set(MODULES) == {"argmax_sjd", "fresh_sjd", "chain_sjd"}
    assert set(CONFIGS) == set(MODULES)


@pytest.fixture
def skeletons(monkeypatch):
    """Each block as the module `sjd.decoders.<name>` (registered before it runs, as an import would)."""
    for name, source in MODULES.items():
        spec = importlib.util.spec_from_loader(f"sjd.decoders.{name}", loader=None)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, module)
        exec(compile(source, f"docs/adding-a-decoder.md ({name}.py)", "exec"), module.__dict__)


def build(name: str):
    """The decoder of a YAML block as the runner builds it: resolved beside a model config, then instantiated."""
    run = OmegaConf.create(
        {"decoder": yaml.safe_load(CONFIGS[name]), "model": OmegaConf.load(ROOT / "conf/model/toy.yaml")}
    )
    node = OmegaConf.to_container(run.decoder, resolve=True)
    target = get_class(node["_target_"])
    assert check_settings("decoder", node, target.__init__) == []
    assert check_settings("decoder", {**node, "windw": 4}, target.__init__), "an unknown key must be refused"
    return instantiate(node)


@pytest.mark.parametrize("name", ["argmax_sjd", "fresh_sjd", "chain_sjd"])
def test_a_skeleton_builds_from_its_yaml_and_equals_greedy_ar(skeletons, name):
    adapter = ToyAdapter()
    decoder = build(name)
    decoder.check(adapter)
    assert decoder.config()["name"] == name and decoder.lossless
    gens = lambda: make_generators(0, [p.prompt_id for p in PROMPTS], adapter.device)  # noqa: E731
    with torch.no_grad():
        ar = ARDecoder().generate(adapter, PROMPTS, GREEDY, gens())
        out = decoder.generate(adapter, PROMPTS, GREEDY, gens())
    assert torch.equal(out.tokens, ar.tokens)
    assert all(n < adapter.layout.n_tokens for n in out.n_forward)  # it did decode several tokens a forward
