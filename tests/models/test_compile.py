"""compile=true: every decoder draws the same tokens with the compiled window forward as with the eager one.

The adapter contract holds each architecture's compiled windows to the eager logits with no graph break and no
recompile (test_compiled_windows_match_eager_with_no_graph_break_or_recompile). Here the decoders: on the toy,
sampled at a fixed seed (SJD2 on the noise-aware toy), every decoder config on the compiled forward against the
eager one on the same (static) cache. Compiling costs a few seconds a window width, so these are slow tests.

The same check on other models, outside CI (a stand-in's graphs take minutes to compile):
    SJD_COMPILE_MODELS=standin_lumina_512_cal python -m pytest tests/models/test_compile.py
runs every decoder config on each listed model, and the decoders that need a noise-aware model (SJD2) on the
toy's noise-aware variant. A model other than the toy decodes greedily (temperature 0): the compiled logits
differ from the eager ones in the last float32 bits (inductor fuses and reorders the sums), and over a stand-in's
thousand sampled tokens one of them can fall on the other side of a top-k cut or a uniform draw. The toy's
images are short enough that the sampled tokens agree, and they are what the test holds there."""

import dataclasses
import os

import pytest
import torch
from decoder_on_model import fitted, resolved_decoder

from sjd.core.seeding import make_generators
from sjd.harness.bookkeeping import build_model
from sjd.harness.decoder_configs import algorithm_configs
from sjd.harness.prompts import load_prompt_file
from sjd.types import EMBEDS

PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:2]
MODELS = os.environ.get("SJD_COMPILE_MODELS", "toy").split(",")  # the models every decoder config is decoded on
NOISE_AWARE = "toy_sjd2"  # for the decoders whose drafts are embeddings (SJD2)
SAMPLED = ("toy", NOISE_AWARE)  # decoded with their sampling settings; other models greedily
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engines():
    """Per model (the toy, and its noise-aware variant for SJD2): the model on the static cache, eager, and a
    second copy whose windows are compiled (once for the module: each window width compiles on first use)."""
    out = {}
    for model in (*MODELS, NOISE_AWARE):
        eager, sampling = build_model(model)
        eager.use_cache("static")
        compiled, _ = build_model(model)
        compiled.compile_windows(None)
        out[model] = (eager, compiled, sampling)
    return out


def decode(decoder, adapter, sampling) -> list:
    with torch.no_grad():
        out = decoder.generate(adapter, PROMPTS, sampling, make_generators(0, [p.prompt_id for p in PROMPTS], "cpu"))
    return [out.tokens.tolist(), out.n_forward, out.accepted]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", algorithm_configs())
def test_every_decoder_draws_the_same_tokens_compiled_as_eager(engines, name, model):
    decoder = resolved_decoder(name, model)
    on = NOISE_AWARE if EMBEDS in decoder.requires else model
    eager, compiled, sampling = engines[on]
    if on not in SAMPLED:
        sampling = dataclasses.replace(sampling, temperature=0.0)
    fitted(decoder, eager)
    assert decode(decoder, compiled, sampling) == decode(decoder, eager, sampling)
