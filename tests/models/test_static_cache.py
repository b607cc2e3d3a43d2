"""The static per-row KV cache (sjd/models/static_cache.py) against the dynamic one (sjd/models/cache.py).

The adapter contract runs its cache tests on both kinds, on every architecture. Here: what the contract does not
drive (transient tree slots adopted with keep_slots, then a plain window on top), the refusal of a window wider
than the scratch region, and every decoder config giving the same tokens on either cache."""

import pytest
import torch
from decoder_on_model import fitted, resolved_decoder

from sjd.bench.bookkeeping import build_model
from sjd.core.seeding import make_generators
from sjd.harness.decoder_configs import algorithm_configs
from sjd.harness.prompts import load_prompt_file
from sjd.models.static_cache import StaticRowCache
from sjd.types import CUSTOM_MASK, EMBEDS, Prompt

PROMPTS = {
    "toy": load_prompt_file("sjd/assets/prompts/toy.tsv")[:3],
    "micro": [Prompt("m0", "a"), Prompt("m1", "b"), Prompt("m2", "a")],
}


@torch.no_grad()
def tree_then_window(adapter) -> list[torch.Tensor]:
    """Prefill; a draft tree per row as EAGLE forwards it: the root (position 0) in place, every node transient
    (two branches of depth 2 in row 0; in row 1 a branch of depth 2, one sibling and a padding slot); adopt a path
    through the second branch in row 0 and through the first in row 1; then a plain window after the path."""
    adapter.prefill(PROMPTS["toy"][:2], with_uncond=True)
    free = adapter.layout.free_token_ids
    tokens = free[torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]) % len(free)]
    positions = torch.tensor([[0, 1, 2, 1, 2], [0, 1, 2, 1, -1]])
    transient = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    ancestors = torch.tensor(  # each node sees its ancestors and itself
        [
            [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 1, 0], [1, 0, 0, 1, 1]],
            [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 1, 0], [0, 0, 0, 0, 1]],
        ],
        dtype=torch.bool,
    )
    keep = torch.zeros(2, adapter.layout.n_tokens, dtype=torch.bool)
    first = adapter.forward_at(tokens, positions, keep, ancestors, transient)
    adapter.keep_slots(torch.tensor([[1, 0, 0, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool))
    window = free[torch.tensor([[3, 1, 4], [1, 5, 9]]) % len(free)]
    second = adapter.forward(window, [3, 3])
    return [first.cond[:, :4], first.uncond[:, :4], second.cond, second.uncond]


@pytest.mark.parametrize("model", ["toy", "micro"])
def test_adopted_tree_slots_give_the_logits_of_the_dynamic_cache(model):
    adapter, _ = build_model(model)
    assert CUSTOM_MASK in adapter.capabilities
    dynamic = tree_then_window(adapter)
    adapter.use_cache("static")
    static = tree_then_window(adapter)
    adapter.use_cache("dynamic")
    for d, s in zip(dynamic, static):
        torch.testing.assert_close(s, d, atol=1e-5, rtol=1e-5)  # float32 rounding of another key order


def test_a_window_wider_than_the_scratch_region_is_refused_by_name():
    cache = StaticRowCache([3, 3], 1, n_tokens=20, device=torch.device("cpu"), scratch=4)
    cache.prefill_kwargs(torch.device("cpu"))
    with pytest.raises(ValueError, match=r"wider than the static cache's scratch of 4 slots.*cache=dynamic"):
        cache.prepare([0], 5, torch.device("cpu"))


def test_an_unknown_cache_kind_is_refused_by_name():
    adapter, _ = build_model("micro")
    with pytest.raises(ValueError, match=r"cache must be one of \('dynamic', 'static'\), got 'paged'"):
        adapter.use_cache("paged")


def decode(name: str, base: str, cache: str) -> list:
    """Decoder `name` on `base` (its noise-aware variant for SJD2) with `cache`: tokens, forwards, accepted."""
    decoder = resolved_decoder(name, base)
    adapter, sampling = build_model(f"{base}_sjd2" if EMBEDS in decoder.requires else base)
    fitted(decoder, adapter)
    adapter.use_cache(cache)
    prompts = PROMPTS[base]
    with torch.no_grad():
        out = decoder.generate(adapter, prompts, sampling, make_generators(0, [p.prompt_id for p in prompts], "cpu"))
    adapter.use_cache("dynamic")
    return [out.tokens.tolist(), out.n_forward, out.accepted]


@pytest.mark.parametrize("name", algorithm_configs())
def test_every_decoder_draws_the_same_tokens_on_either_cache_on_the_micro_model(name):
    assert decode(name, "micro", "static") == decode(name, "micro", "dynamic")


@pytest.mark.slow
@pytest.mark.parametrize("name", algorithm_configs())
def test_every_decoder_draws_the_same_tokens_on_either_cache_on_the_toy(name):
    assert decode(name, "toy", "static") == decode(name, "toy", "dynamic")


def test_compiling_windows_moves_to_the_static_cache_and_lifts_dynamos_recompile_limit():
    """Each (batch rows, width bucket) is a graph of one frame; at dynamo's default limit of 8 the ninth would
    quietly run eagerly. torch.compile is lazy: nothing compiles here. The limit is process-wide: the test starts
    it at the default, whatever an earlier test left, and puts back the value it found (dynamo's own config.patch;
    pytest's monkeypatch would delete the setting on undo, as it is not in the config module's __dict__)."""
    found = torch._dynamo.config.recompile_limit
    with torch._dynamo.config.patch(recompile_limit=8):
        adapter, _ = build_model("micro")
        adapter.compile_windows(None)
        try:
            assert adapter.compiled and adapter.cache_kind == "static"
            assert torch._dynamo.config.recompile_limit >= 256
            assert [adapter.bucket(w) for w in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, 32]
        finally:
            adapter.uncompile()
        assert adapter.bucket(3) == 3  # eager: no padding
    assert torch._dynamo.config.recompile_limit == found


def test_a_compiled_window_pads_to_the_narrowest_width_its_own_decode_call_already_forwards():
    """The narrower windows at the end of an image reuse the call's widest graph instead of compiling one per
    power of two below it; AR's one-token steps stay one token wide; and the next call (a new cache, from its
    prefill) starts afresh, so one decoder's windows never pad to the widths another decoder forwarded."""
    adapter, _ = build_model("micro")
    adapter.compile_windows(None)  # lazy: nothing compiles here
    try:
        adapter.prefill([Prompt("p0", "a")], with_uncond=True)
        assert [adapter.bucket(w) for w in (1, 16, 3, 1, 9, 16, 17, 20)] == [1, 16, 16, 1, 16, 16, 32, 32]
        adapter.prefill([Prompt("p0", "a")], with_uncond=True)  # the next decode call
        assert [adapter.bucket(w) for w in (1, 3, 2, 5)] == [1, 4, 4, 8]  # not 16: that width was the last call's
    finally:
        adapter.uncompile()
