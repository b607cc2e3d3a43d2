"""The decoder contract: every decoder config (conf/decoder/*.yaml, found by globbing, so a new one is
checked without editing this file) on the toy and the micro model.

A decoder whose `requires` names the `embeds` capability runs on the noise-aware variant of the model
(conf/model/<model>_sjd2.yaml). A pair whose model still lacks a required capability is not decoded:
its test asserts that the decoder's start-up check refuses the model and names what is missing.

Checks, each with fixed seeds: forced tokens hold; every row commits n_tokens; a prompt decoded alone
equals its row in a batch of several; the same seed gives the same tokens and another seed others; a
lossless decoder (`Decoder.lossless`) at temperature 0 equals greedy AR token for token.

Settings: the config's own on the toy model, except where the model cannot take them (a PJD context
wider than the toy's rows); on the micro model (8 tokens an image) the exactness audit's
`micro_decoder` settings from conf/audit.yaml.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.base import Decoder, DecodeResult
from sjd.harness.decoder_configs import algorithm_configs
from sjd.harness.decoder_configs import decoder_config as load_decoder_config
from sjd.harness.prompts import load_prompt_file
from sjd.models.base import ModelAdapter
from sjd.types import EMBEDS, Prompt

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
DECODERS = algorithm_configs()  # a variant is one of these with other settings (sjd/harness/decoder_configs.py)
MODELS = ("toy", "micro")
NOISE_AWARE = "{}_sjd2"  # the model variant that has the `embeds` capability
PROMPTS = {
    "toy": load_prompt_file(ROOT / "sjd/assets/prompts/toy.tsv")[:3],
    "micro": [Prompt("m0", "a"), Prompt("m1", "b"), Prompt("m2", "a")],
}
MICRO_SETTINGS = OmegaConf.to_container(OmegaConf.load(CONF / "audit.yaml").micro_decoder)

pytestmark = pytest.mark.usefixtures("one_thread")


def decoder_config(name: str, model: str):
    """conf/decoder/<name>.yaml, resolved as the `decoder` node of a run config on `model` (a drafter decoder
    takes the model's shipped drafter, `model.drafter`)."""
    run = OmegaConf.create({"decoder": load_decoder_config(name), "model": model_config(model)})
    return OmegaConf.create(OmegaConf.to_container(run.decoder, resolve=True))


def model_config(name: str):
    return OmegaConf.load(CONF / "model" / f"{name}.yaml")


@dataclass(frozen=True)
class Pair:
    decoder: str  # conf/decoder/<decoder>.yaml
    base: str  # toy or micro
    model: str  # conf/model/<model>.yaml: the base, or its noise-aware variant
    missing: tuple[str, ...]  # capabilities the decoder requires and the model lacks
    lossless: bool
    reference: bool  # the decoder is AR itself

    @property
    def id(self) -> str:
        return f"{self.decoder}-{self.model}"

    @property
    def prompts(self) -> list[Prompt]:
        return PROMPTS[self.base]


def pair(decoder: str, base: str) -> Pair:
    """Classes and capabilities are read off the configs' targets: nothing is built to collect."""
    decoder_obj = instantiate(decoder_config(decoder, base))
    model = NOISE_AWARE.format(base) if EMBEDS in decoder_obj.requires else base
    capabilities = get_class(model_config(model).adapter._target_).capabilities
    missing = tuple(sorted(decoder_obj.requires - capabilities))
    return Pair(decoder, base, model, missing, bool(decoder_obj.lossless), isinstance(decoder_obj, ARDecoder))


PAIRS = [pair(d, m) for d in DECODERS for m in MODELS]
APPLICABLE = [p for p in PAIRS if not p.missing]
LOSSLESS = [p for p in APPLICABLE if p.lossless and not p.reference]
ON_MICRO = [p for p in APPLICABLE if p.base == "micro"]


def ids(pairs: list[Pair]) -> list[str]:
    return [p.id for p in pairs]


@functools.cache
def adapter_and_sampling(model: str) -> tuple[ModelAdapter, SamplingConfig]:
    cfg = model_config(model)
    return instantiate(cfg.adapter, device="cpu"), SamplingConfig(**OmegaConf.to_container(cfg.sampling))


def build(p: Pair, check: bool = True) -> tuple[Decoder, ModelAdapter, SamplingConfig]:
    adapter, sampling = adapter_and_sampling(p.model)
    cfg = decoder_config(p.decoder, p.model)
    if model_config(p.model).get("enumerable", False):
        for key, value in MICRO_SETTINGS.items():
            if key in cfg and value is not None:
                cfg[key] = value
    layout = adapter.layout
    for key, most in (("window", layout.n_tokens), ("context", layout.width)):  # what the model can take
        if key in cfg:
            cfg[key] = min(cfg[key], most)
    decoder = instantiate(cfg)
    if check:
        decoder.check(adapter)
    return decoder, adapter, sampling


def gens(prompts: list[Prompt], seed: int) -> list[torch.Generator]:
    return make_generators(seed, [q.prompt_id for q in prompts], torch.device("cpu"))


def run(p: Pair, rows: tuple[int, ...], seed: int = 0, greedy: bool = False) -> DecodeResult:
    decoder, adapter, sampling = build(p)
    if greedy:
        sampling = dataclasses.replace(sampling, temperature=0.0)
    prompts = [p.prompts[i] for i in rows]
    return decoder.generate(adapter, prompts, sampling, gens(prompts, seed))


cached_run = functools.cache(run)
EVERY_ROW = (0, 1, 2)


# -- the contract ----------------------------------------------------------------------------------
@pytest.mark.parametrize("p", PAIRS, ids=ids(PAIRS))
def test_the_decoder_runs_on_the_model_or_names_the_missing_capability(p):
    decoder = instantiate(decoder_config(p.decoder, p.model))
    adapter, _ = adapter_and_sampling(p.model)
    if p.missing:  # not applicable: the start-up check must say so, naming decoder, model and capability
        expected = f"{decoder.name!r} needs model capabilities {list(p.missing)!r}"
        with pytest.raises(ValueError, match=re.escape(expected)):
            decoder.check(adapter)
        return
    build(p)  # the settings it runs with here pass its start-up check


@pytest.mark.parametrize("p", APPLICABLE, ids=ids(APPLICABLE))
def test_forced_tokens_hold_and_every_row_commits_each_token_once(p):
    res = cached_run(p, EVERY_ROW)
    layout = adapter_and_sampling(p.model)[0].layout
    forced = layout.forced >= 0
    assert (res.tokens[:, forced] == layout.forced[forced]).all()
    assert layout.free_tokens[res.tokens[:, ~forced]].all()
    assert [sum(a) for a in res.accepted] == [layout.n_tokens] * len(EVERY_ROW)
    assert [len(a) for a in res.accepted] == res.n_forward


@pytest.mark.parametrize("p", APPLICABLE, ids=ids(APPLICABLE))
def test_a_prompt_decoded_alone_equals_its_row_in_a_batch(p):
    batch = cached_run(p, EVERY_ROW).tokens
    assert torch.equal(cached_run(p, (1,)).tokens[0], batch[1])
    assert torch.equal(run(p, (2, 0)).tokens, batch[[2, 0]])  # another composition and order


@pytest.mark.parametrize("p", APPLICABLE, ids=ids(APPLICABLE))
def test_the_seed_decides_the_samples(p):
    assert torch.equal(run(p, (1,)).tokens, cached_run(p, (1,)).tokens)
    assert not torch.equal(run(p, EVERY_ROW, seed=1).tokens, cached_run(p, EVERY_ROW).tokens)


@pytest.mark.parametrize("p", LOSSLESS, ids=ids(LOSSLESS))
def test_a_lossless_decoder_at_temperature_zero_equals_greedy_ar(p):
    ar = cached_run(dataclasses.replace(p, decoder="ar"), EVERY_ROW, greedy=True)
    res = run(p, EVERY_ROW, seed=5, greedy=True)
    assert torch.equal(res.tokens, ar.tokens)


@pytest.mark.parametrize("p", ON_MICRO, ids=ids(ON_MICRO))
def test_a_call_leaves_nothing_on_the_decoder_and_needs_no_earlier_check(p):
    """What one generate() call needs travels with the call: the decoder's attributes are the same
    objects after it as before, and a decoder whose start-up check never ran decodes the same tokens."""
    decoder, adapter, sampling = build(p, check=False)
    before = dict(vars(decoder))
    prompts = [p.prompts[1]]
    res = decoder.generate(adapter, prompts, sampling, gens(prompts, 0))
    assert vars(decoder).keys() == before.keys()
    assert all(vars(decoder)[k] is v for k, v in before.items())
    assert torch.equal(res.tokens, cached_run(p, (1,)).tokens)
