import pytest
import torch

from sjd.core.sampling import SamplingConfig, cfg_mix, filter_top_k_top_p, logits_to_probs, sample_from
from sjd.toy.tokenizer import ToyVocab
from sjd.types import Logits


def test_cfg_mix_is_uncond_plus_scaled_difference():
    cond, uncond = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    torch.testing.assert_close(cfg_mix(Logits(cond, uncond), 3.0), uncond + 3.0 * (cond - uncond))
    assert cfg_mix(Logits(cond, None), 3.0) is cond
    assert cfg_mix(Logits(cond, uncond), 1.0) is cond


def test_grammar_forces_layout_tokens_and_restricts_free_positions(toy):
    layout, vocab = toy.layout, ToyVocab()
    positions = torch.arange(layout.n_tokens)[None]
    mask = layout.allowed_table(positions.device)[positions][0]
    assert mask[0].sum() == 1 and mask[0, vocab.boi]
    assert mask[13].sum() == 1 and mask[13, vocab.eol]  # end of the first row
    assert mask[-1].sum() == 1 and mask[-1, vocab.eoi]
    free = mask[1]
    assert free.sum() == vocab.boi - vocab.code_offset and not free[: vocab.code_offset].any()


def test_pipeline_respects_grammar_top_k_and_greedy(toy):
    layout = toy.layout
    logits = Logits(torch.randn(2, 4, layout.vocab_size), torch.randn(2, 4, layout.vocab_size))
    positions = torch.tensor([[0, 1, 2, 13], [1, 2, 3, 4]])
    probs = logits_to_probs(logits, positions, layout, SamplingConfig(cfg_scale=2.0, top_k=5))
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4))
    assert probs[0, 0, ToyVocab().boi] == 1 and probs[0, 3, ToyVocab().eol] == 1
    assert ((probs[1] > 0).sum(-1) == 5).all()
    greedy = logits_to_probs(logits, positions, layout, SamplingConfig(cfg_scale=2.0, temperature=0))
    assert ((greedy == 1).sum(-1) == 1).all()
    guided = cfg_mix(logits, 2.0).masked_fill(~layout.allowed_table(positions.device)[positions], float("-inf"))
    assert (greedy.argmax(-1) == guided.argmax(-1)).all()


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filter_top_k_top_p(logits, None, 0.7).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    kept = filter_top_k_top_p(logits, None, 0.85).isfinite()
    assert kept.tolist() == [[True, True, True, False]]


def test_sample_from_matches_probabilities_and_never_picks_zero_mass():
    probs = torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3, 0.0])
    u = torch.rand(200_000, generator=torch.Generator().manual_seed(0))
    ids = sample_from(probs.expand(len(u), -1), u)
    freq = torch.bincount(ids, minlength=6).float() / len(u)
    assert freq[[0, 2, 5]].sum() == 0
    torch.testing.assert_close(freq, probs, atol=5e-3, rtol=0)
    # The very top of [0, 1) must not fall through to the masked last id.
    assert sample_from(probs, torch.tensor(1 - 1e-9)).item() == 4


@pytest.mark.parametrize(
    "kwargs, key",
    [({"cfg_scale": -1.0}, "cfg_scale"), ({"top_k": 0}, "top_k"), ({"temperature": -0.1}, "temperature")],
)
def test_invalid_sampling_settings_name_the_config_key(kwargs, key):
    with pytest.raises(ValueError, match=f"model.sampling.{key}"):
        SamplingConfig(**kwargs)
