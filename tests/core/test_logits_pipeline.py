"""The logits pipeline (sjd.core.sampling.logits_to_probs) against the implementation it replaced.

The reference is that implementation verbatim, kept in sjd/bench/replaced_pipeline.py: the grammar mask
over the full vocabulary, then CFG, temperature, top-k / top-p and softmax over all V ids. The new pipeline
filters the free columns only and scatters back; the probabilities must agree to 1e-6 on random logits.
"""

import pytest
import torch

from sjd.bench.replaced_pipeline import filter_top_k_top_p, logits_to_probs
from sjd.core import sampling
from sjd.core.sampling import SamplingConfig
from sjd.types import ImageLayout, Logits


# -- layouts -------------------------------------------------------------------------------------------
def make_layout(vocab: int, free_ids: torch.Tensor, n_tokens: int = 12) -> ImageLayout:
    """Forced ids at the start, at every fourth position and at the end (some outside the free set)."""
    forced = torch.full((n_tokens,), -1, dtype=torch.long)
    forced[0], forced[4::4], forced[-1] = vocab - 1, vocab - 2, int(free_ids[0])
    free = torch.zeros(vocab, dtype=torch.bool)
    free[free_ids] = True
    return ImageLayout(n_tokens, 2, 4, 5, 1, forced, free, vocab)


LAYOUTS = {
    "contiguous codes": make_layout(600, torch.arange(4, 516)),  # Chameleon-like: one code range
    "scattered codes": make_layout(700, torch.randperm(690, generator=torch.Generator().manual_seed(1))[:400]),
    "every id free": make_layout(256, torch.arange(256)),  # LlamaGen / Janus
    "top_k above the free ids": make_layout(200, torch.arange(10, 40)),  # 30 free ids, top_k 50 < V
}
SETTINGS = [
    SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=50),
    SamplingConfig(cfg_scale=3.0, temperature=0.7, top_k=50, top_p=0.9),
    SamplingConfig(cfg_scale=1.0, temperature=1.3, top_p=0.8),
    SamplingConfig(cfg_scale=2.0, temperature=1.0),
    SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=1),
    SamplingConfig(cfg_scale=3.0, temperature=0.0, top_k=50),  # greedy
]


def random_window(layout: ImageLayout, B: int = 3, W: int = 6, seed: int = 0, uncond: bool = True):
    """Logits and positions of a ragged window: row 1 runs past the image (padding slots)."""
    g = torch.Generator().manual_seed(seed)
    V = layout.vocab_size
    cond = 3 * torch.randn(B, W, V, generator=g)
    unc = 3 * torch.randn(B, W, V, generator=g) if uncond else None
    starts = torch.tensor([0, layout.n_tokens - 2, 3])[:B]
    positions = starts[:, None] + torch.arange(W)
    return Logits(cond, unc), positions


@pytest.mark.parametrize("settings", SETTINGS, ids=repr)
@pytest.mark.parametrize("name", LAYOUTS)
def test_pipeline_equals_the_full_vocabulary_reference(name, settings):
    layout = LAYOUTS[name]
    for seed in range(3):
        logits, positions = random_window(layout, seed=seed, uncond=settings.cfg_scale != 1.0)
        new = sampling.logits_to_probs(logits, positions, layout, settings)
        ref = logits_to_probs(logits, positions, layout, settings)
        assert new.shape == ref.shape and new.dtype == ref.dtype == torch.float32
        torch.testing.assert_close(new, ref, atol=1e-6, rtol=0)
        forced = layout.forced[positions.clamp(max=layout.n_tokens - 1)]
        at_forced = (positions < layout.n_tokens) & (forced >= 0)
        assert (new[at_forced].max(-1).values == 1).all()  # forced positions stay exactly one-hot


def test_bfloat16_logits_with_ties_match_the_reference():
    """bf16 logits tie often; both keep every id tied with the k-th largest guided logit."""
    layout = LAYOUTS["contiguous codes"]
    logits, positions = random_window(layout)
    logits = Logits(logits.cond.bfloat16(), logits.uncond.bfloat16())
    settings = SamplingConfig(cfg_scale=3.0, top_k=50)
    new = sampling.logits_to_probs(logits, positions, layout, settings)
    torch.testing.assert_close(new, logits_to_probs(logits, positions, layout, settings), atol=1e-6, rtol=0)


def test_top_k_keeps_every_id_tied_with_the_kth_largest():
    logits = torch.tensor([[4.0, 3.0, 2.0, 2.0, 2.0, 1.0]])
    kept = sampling.filter_top_k_top_p(logits, 3, None).isfinite()
    assert kept.tolist() == [[True, True, True, True, True, False]]  # 5 ids survive top-k 3
    assert (filter_top_k_top_p(logits, 3, None).isfinite() == kept).all()  # as the reference did


def test_top_p_keeps_every_id_tied_with_the_last_one_the_nucleus_needs():
    logits = torch.log(torch.tensor([[0.4, 0.2, 0.2, 0.2]]))
    kept = sampling.filter_top_k_top_p(logits, None, 0.5).isfinite()  # 0.4 + one 0.2 reach 0.5
    assert kept.tolist() == [[True, True, True, True]]  # the reference kept an arbitrary one of the ties


def test_top_k_then_top_p_cut_inside_the_top_k_values():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.1, 0.3, 0.05]]))
    kept = sampling.filter_top_k_top_p(logits, 3, 0.7).isfinite()  # top-3 {0.5, 0.3, 0.1}; 0.5 + 0.3 > 0.7
    assert kept.tolist() == [[False, True, False, True, False]]


@pytest.mark.parametrize("m", [1, 7, 64])
@pytest.mark.parametrize("ordered", [False, True])
def test_numpy_and_torch_paths_find_the_same_largest_values(m, ordered):
    """CPU partitions with numpy, other devices use torch.topk: the values must agree."""
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(2)).round(decimals=1)  # with ties
    fast, plain = sampling.largest_values(x, m, ordered), sampling.torch_largest_values(x, m, ordered)
    if not ordered:
        fast, plain = fast.sort(-1).values, plain.sort(-1).values
    assert torch.equal(fast, plain)
