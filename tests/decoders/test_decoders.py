"""AR and SJD on the shipped toy model, beyond the decoder contract (tests/decoders/test_decoder_contract.py,
which runs every conf/decoder config): greedy exactness across draft inits and windows, the grammar
under other settings, AR's forward count, and the errors."""

import pytest
import torch

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.jacobi import JacobiDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.prompts import load_prompt_file
from sjd.types import Prompt

PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:4]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0)


def gens(prompts, seed=0):
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


@pytest.mark.parametrize(
    "window,init",
    # (16, random) is conf/decoder/sjd.yaml: the decoder contract runs it
    [(4, "random"), (4, "horizontal"), (4, "vertical"), (4, "sample_horizon")]
    + [(16, "horizontal"), (16, "vertical"), (16, "sample_horizon")],
)
def test_greedy_sjd_equals_greedy_ar_token_for_token(toy, init, window):
    ar = ARDecoder().generate(toy, PROMPTS, GREEDY, gens(PROMPTS))
    sjd = SJDDecoder(window=window, init=init).generate(toy, PROMPTS, GREEDY, gens(PROMPTS, seed=7))
    assert torch.equal(ar.tokens, sjd.tokens)
    assert all(n < toy.layout.n_tokens for n in sjd.n_forward)  # it did accelerate


@pytest.mark.parametrize("window", [3])  # 16 is conf/decoder/jacobi.yaml: the decoder contract runs it
def test_greedy_jacobi_equals_greedy_ar_token_for_token(toy, window):
    ar = ARDecoder().generate(toy, PROMPTS, GREEDY, gens(PROMPTS))
    jacobi = JacobiDecoder(window=window).generate(toy, PROMPTS, GREEDY, gens(PROMPTS, seed=7))
    assert torch.equal(ar.tokens, jacobi.tokens)


def test_ar_takes_one_forward_per_token(toy):
    res = ARDecoder().generate(toy, PROMPTS[:2], SAMPLED, gens(PROMPTS[:2]))
    assert res.n_forward == [toy.layout.n_tokens] * 2
    assert [sum(a) for a in res.accepted] == [toy.layout.n_tokens] * 2


@pytest.mark.parametrize(
    "decoder", [SJDDecoder(window=5, init="vertical"), JacobiDecoder(window=8)]
)  # AR and conf/decoder/sjd.yaml: the decoder contract
def test_forced_positions_hold_their_forced_token(toy, decoder):
    res = decoder.generate(toy, PROMPTS, SAMPLED, gens(PROMPTS))
    forced = toy.layout.forced
    where = forced >= 0
    assert (res.tokens[:, where] == forced[where]).all()
    free = res.tokens[:, ~where]
    assert toy.layout.free_tokens[free].all()
    assert [sum(a) for a in res.accepted] == [toy.layout.n_tokens] * len(PROMPTS)


def test_decoder_config_errors_come_before_any_model_is_loaded():
    with pytest.raises(ValueError, match="decoder.window"):
        SJDDecoder(window=0)
    with pytest.raises(ValueError, match="decoder.init"):
        SJDDecoder(init="diagonal")


def test_window_larger_than_the_image_is_refused(toy):
    with pytest.raises(ValueError, match="decoder.window=500"):
        SJDDecoder(window=500).check(toy)


def test_prompts_the_model_cannot_take_are_named(toy):
    with pytest.raises(ValueError, match="'p9' is empty"):
        toy.check_prompts([Prompt("p9", "   ")])
    long = " and ".join(["large red circle top left"] * 5) + " on blue"
    with pytest.raises(ValueError, match="'long1'.*text context"):
        toy.check_prompts([Prompt("long1", long)])
