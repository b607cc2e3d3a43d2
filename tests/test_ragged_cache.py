"""The adapter's cache: a window forward, a truncate and a new window agree with a fresh
uncached forward, with rows at different lengths (holes) and with CFG rows."""

import torch

from sjd.models.base import Prompt
from sjd.models.ragged_cache import RaggedCache
from sjd.toy.model import TEXT_CONTEXT


def _fresh(adapter, prompt_ids, generated):
    """Uncached logits of prompt + generated tokens, at the generated positions."""
    ids = torch.cat([prompt_ids, generated], dim=1)
    return adapter.model(input_ids=ids).logits[:, TEXT_CONTEXT - 1 :].float()


def test_ragged_windows_match_uncached_forward(toy):
    torch.manual_seed(0)
    prompts = [Prompt("a", "large red circle center on blue"), Prompt("b", "small green square top on white")]
    prompt_ids = toy.prompt_ids(prompts, with_uncond=True)
    seq = torch.randint(toy.vocab.code_offset, toy.vocab.boi, (2, 60))
    with torch.no_grad():
        toy.prefill(prompts, with_uncond=True)
        toy.forward(seq[:, :20], [0, 0])
        # Row 0 keeps 12 generated positions, row 1 keeps 17: a ragged batch with holes.
        toy.truncate([12, 17])
        lengths = [12, 17]
        window = torch.stack([seq[0, 12:20], seq[1, 17:25]])
        out = toy.forward(window, lengths)
        for b, n in enumerate(lengths):
            gen = torch.cat([seq[b, :n], window[b]])[None]
            both = torch.cat([gen, gen])
            ref = _fresh(toy, prompt_ids[[b, b + 2]], both)
            torch.testing.assert_close(out.cond[b], ref[0, n + 1 : n + 9], atol=2e-4, rtol=0)
            torch.testing.assert_close(out.uncond[b], ref[1, n + 1 : n + 9], atol=2e-4, rtol=0)
        # Rewind row 0 into the middle of its last window and continue.
        out = toy.forward(torch.stack([seq[0, 14:18], seq[1, 25:29]]), [14, 25])
        gen = torch.cat([seq[0, :14], seq[0, 14:18]])[None]
        ref = _fresh(toy, prompt_ids[[0]], gen)
        torch.testing.assert_close(out.cond[0], ref[0, 15:19], atol=2e-4, rtol=0)


def test_truncate_crops_slots_no_row_uses():
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    cache = RaggedCache(cfg, [4, 4], uncond_copies=0)
    cache.prepare([0, 0], 6, torch.device("cpu"))
    k = torch.zeros(2, 2, 10, 8)
    cache.cache.update(k, k, 0)
    cache.truncate([3, 5])
    assert cache.slot_pos.shape[1] == 9 and cache.cache.get_seq_length() == 9
    assert (cache.slot_pos[0] >= 0).sum() == 7 and (cache.slot_pos[1] >= 0).sum() == 9
    cache.truncate([3, 3])
    assert cache.cache.get_seq_length() == 7
