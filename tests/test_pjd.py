"""PJD on the toy model: its layout rules, greedy exactness where it must hold, and its errors."""

import pytest
import torch

from sjd.decoders.ar import ARDecoder
from sjd.decoders.pjd import PJDDecoder
from sjd.models.base import WINDOW
from sjd.models.micro import MicroAdapter
from sjd.prompts import load_prompt_file
from sjd.provenance import make_generators
from sjd.sampling import SamplingConfig

PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:4]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0)


def gens(prompts, seed=0):
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


@pytest.mark.parametrize("window,init", [(4, "random"), (8, "vertical"), (12, "random")])
def test_greedy_pjd_with_full_row_context_equals_greedy_ar(toy, window, init):
    """With context = the row width a row starts only when the row above is complete, so every
    token sees the whole raster past: PJD must then equal greedy AR token for token."""
    ar = ARDecoder().generate(toy, PROMPTS, GREEDY, gens(PROMPTS))
    pjd = PJDDecoder(window=window, context=toy.layout.width, init=init)
    res = pjd.generate(toy, PROMPTS, GREEDY, gens(PROMPTS, seed=5))
    assert torch.equal(ar.tokens, res.tokens)
    assert all(n < toy.layout.n_tokens for n in res.n_forward)


def test_pjd_rows_overlap_and_keep_the_grammar(toy):
    full = PJDDecoder(context=toy.layout.width).generate(toy, PROMPTS, SAMPLED, gens(PROMPTS))
    res = PJDDecoder(window=8, context=4).generate(toy, PROMPTS, SAMPLED, gens(PROMPTS))
    forced = toy.layout.forced
    assert (res.tokens[:, forced >= 0] == forced[forced >= 0]).all()
    assert toy.layout.free_tokens[res.tokens[:, forced < 0]].all()
    assert [sum(a) for a in res.accepted] == [toy.layout.n_tokens] * len(PROMPTS)
    # Rows decoded in parallel need fewer forwards than rows decoded one after another.
    assert sum(res.n_forward) < sum(full.n_forward)


def test_pjd_tokens_do_not_depend_on_batch_composition(toy):
    pjd = PJDDecoder(window=6, context=5)
    batch = pjd.generate(toy, PROMPTS, SAMPLED, gens(PROMPTS)).tokens
    alone = pjd.generate(toy, [PROMPTS[2]], SAMPLED, gens([PROMPTS[2]])).tokens[0]
    assert torch.equal(alone, batch[2])


def test_pjd_needs_the_custom_mask_capability():
    micro = MicroAdapter()
    micro.capabilities = frozenset({WINDOW})
    with pytest.raises(ValueError, match=r"'pjd' needs model capabilities \['custom_mask'\].*'micro'"):
        PJDDecoder(context=1).check(micro)


def test_pjd_refuses_layouts_it_cannot_anchor(toy):
    with pytest.raises(ValueError, match="decoder.context=13 exceeds the 12 codes"):
        PJDDecoder(context=13).check(toy)
    micro = MicroAdapter()
    layout = micro.layout
    micro.layout = type(layout)(**{**vars(layout), "row_stride": layout.width})
    with pytest.raises(ValueError, match="end-of-line token"):
        PJDDecoder(context=1).check(micro)


def test_pjd_config_errors_come_before_any_model_is_loaded():
    for kwargs, key in (
        ({"window": 0}, "decoder.window"),
        ({"keep_threshold": 1.5}, "decoder.keep_threshold"),
        ({"init": "diagonal"}, "decoder.init"),
    ):
        with pytest.raises(ValueError, match=key):
            PJDDecoder(**kwargs)
