"""The Emu3 adapter on a tiny random `Emu3ForConditionalGeneration`: cache equivalence with CFG rows
of different prompt lengths, AR against the library's own `generate`, greedy SJD / Jacobi against
AR, the grammar, image decoding and the missing-weights error."""

import numpy as np
import pytest
import torch

from sjd.core.sampling import SamplingConfig
from sjd.decoders.ar import ARDecoder
from sjd.decoders.jacobi import JacobiDecoder
from sjd.decoders.pjd import PJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.provenance import make_generators
from sjd.models.emu3 import NEGATIVE_PROMPT, Emu3Adapter
from sjd.types import Prompt

PAD, BOI, EOI, WRAPPER, EOL, EOF, BOS, EOS = 0, 2, 3, 4, 5, 6, 7, 8
TEXT0, N_TEXT = 10, 80  # character ids 10..89
CODE0, N_CODES = 100, 64  # visual token i is id 100 + i
H, W = 3, 5  # a non-square code grid
N_TOKENS = H * (W + 1) + 3
PROMPTS = [Prompt("p0", "a red fox in the snow"), Prompt("p1", "two cats")]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)


def encode(text: str) -> list[int]:
    """A character tokenizer over the tiny vocabulary's text ids."""
    return [TEXT0 + ord(c) % N_TEXT for c in text]


def tiny_emu3():
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    vmap = {
        "<|endoftext|>": PAD,
        "<image>": 1,
        "<|image start|>": BOI,
        "<|image end|>": EOI,
        "<|image token|>": WRAPPER,
        "<|extra_200|>": EOL,
        "<|extra_201|>": EOF,
        **{f"<|visual token {i:06d}|>": CODE0 + i for i in range(N_CODES)},
    }
    config = Emu3Config(
        vocabulary_map=vmap,
        text_config=dict(
            vocab_size=192,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
            attention_dropout=0.0,
        ),
        vq_config=dict(
            codebook_size=N_CODES,
            embed_dim=4,
            latent_channels=4,
            base_channels=32,
            channel_multiplier=[1, 2],
            num_res_blocks=1,
            attn_resolutions=[],
            hidden_size=64,
            num_attention_heads=1,
        ),
    )
    torch.manual_seed(0)
    model = Emu3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # spread the logits so that greedy ties cannot flip on rounding
        model.lm_head.weight.mul_(8.0)
    return model


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def emu3():
    return Emu3Adapter.from_model(tiny_emu3(), encode, height=H, width=W)


def gens(prompts, seed=0):
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


def _fresh(adapter, row_ids, generated):
    """Uncached logits of one unpadded prompt row + generated tokens, at the generated positions
    (output i predicts generated position i)."""
    ids = torch.cat([torch.tensor(row_ids), generated])[None]
    with torch.no_grad():
        return adapter.model(input_ids=ids).logits[0, len(row_ids) - 1 :].float()


def test_prompt_rows_and_layout_follow_emu3(emu3):
    ids, lengths = emu3.prompt_batch(PROMPTS, with_uncond=True)
    size = encode(f"{H}*{W}")
    for row, n in zip(ids, lengths):
        real = row[len(row) - n :].tolist()
        assert real[0] == BOS and real[-len(size) - 2 :] == [BOI, *size, WRAPPER]
        assert (row[: len(row) - n] == PAD).all()
    assert ids[2, ids.shape[1] - lengths[2] :].tolist() == emu3.row_ids(NEGATIVE_PROMPT)
    assert len(set(lengths)) == 3  # two captions and the negative prompt: three lengths

    layout = emu3.layout
    assert (layout.n_tokens, layout.height, layout.width, layout.row_stride) == (N_TOKENS, H, W, W + 1)
    expected = [-1] * N_TOKENS
    for r in range(H):
        expected[r * (W + 1) + W] = EOL
    expected[-3:] = [EOF, EOI, EOS]
    assert layout.forced.tolist() == expected
    assert layout.free_token_ids.tolist() == list(range(CODE0, CODE0 + N_CODES))


def test_cached_windows_match_uncached_forward_with_ragged_prompts(emu3):
    _, lengths = emu3.prompt_batch(PROMPTS, with_uncond=True)
    rows = [emu3.row_ids(p.text + emu3.positive_suffix) for p in PROMPTS] + [emu3.row_ids(NEGATIVE_PROMPT)] * 2
    assert [len(r) for r in rows] == lengths
    seq = torch.randint(CODE0, CODE0 + N_CODES, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first = emu3.prefill(PROMPTS, with_uncond=True)
        for b in range(2):
            torch.testing.assert_close(first.cond[b, 0], _fresh(emu3, rows[b], seq[b, :0])[0], atol=2e-4, rtol=0)
            torch.testing.assert_close(first.uncond[b, 0], _fresh(emu3, rows[2 + b], seq[b, :0])[0], atol=2e-4, rtol=0)
        out = emu3.forward(seq[:, :12], [0, 0])
        for b in range(2):
            torch.testing.assert_close(out.cond[b], _fresh(emu3, rows[b], seq[b, :12])[1:], atol=2e-4, rtol=0)
        # Row 0 keeps 5 generated positions, row 1 keeps 9: holes on top of the left padding.
        emu3.truncate([5, 9])
        window = torch.stack([seq[0, 5:11], seq[1, 9:15]])
        out = emu3.forward(window, [5, 9])
        for b, n in enumerate([5, 9]):
            gen = torch.cat([seq[b, :n], window[b]])
            torch.testing.assert_close(out.cond[b], _fresh(emu3, rows[b], gen)[n + 1 :], atol=2e-4, rtol=0)
            torch.testing.assert_close(out.uncond[b], _fresh(emu3, rows[2 + b], gen)[n + 1 :], atol=2e-4, rtol=0)
        # Rewind row 0 into its last window and continue with other tokens.
        out = emu3.forward(torch.stack([seq[0, 20:24], seq[1, 15:19]]), [7, 15])
        gen = torch.cat([seq[0, :5], window[0, :2], seq[0, 20:24]])
        torch.testing.assert_close(out.cond[0], _fresh(emu3, rows[0], gen)[8:], atol=2e-4, rtol=0)
        torch.testing.assert_close(out.uncond[0], _fresh(emu3, rows[2], gen)[8:], atol=2e-4, rtol=0)


def _fresh_at(adapter, row_ids, tokens, positions):
    """Uncached logits of one unpadded prompt row + tokens at generated `positions` (increasing)."""
    T = len(row_ids)
    ids = torch.cat([torch.tensor(row_ids), tokens])[None]
    pos = torch.cat([torch.arange(T), T + torch.as_tensor(positions)])[None]
    with torch.no_grad():
        return adapter.model(input_ids=ids, position_ids=pos).logits[0, T:].float()


def test_custom_mask_window_matches_fresh_computations_with_ragged_prompts(emu3):
    """The `custom_mask` capability (PJD's window) on left-padded CFG rows: two segments of row 0,
    the second seeing only the first one's committed anchor, and one causal segment of row 1."""
    rows = [emu3.row_ids(p.text + emu3.positive_suffix) for p in PROMPTS] + [emu3.row_ids(NEGATIVE_PROMPT)] * 2
    tok = torch.randint(CODE0, CODE0 + N_CODES, (2, 7), generator=torch.Generator().manual_seed(1))
    positions = torch.tensor([[0, 1, 2, 3, 9, 10, 11], [0, 1, 2, 3, 4, 5, -1]])
    segment = torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, -1]])
    committed = torch.zeros(2, 7, dtype=torch.bool)
    committed[:, 0] = True
    idx = torch.arange(7)
    own = (segment[:, :, None] == segment[:, None, :]) & (idx[:, None] >= idx[None, :]) & (segment[:, :, None] >= 0)
    mask = own | (committed[:, None, :] & (positions[:, None, :] < positions[:, :, None]))
    with torch.no_grad():
        emu3.prefill(PROMPTS, with_uncond=True)
        out = emu3.forward_at(tok, positions, torch.zeros(2, N_TOKENS, dtype=torch.bool), mask)
    for b in range(2):
        for branch, row in ((out.cond[b], rows[b]), (out.uncond[b], rows[2 + b])):
            ref = _fresh_at(emu3, row, tok[b, :4], [0, 1, 2, 3])
            torch.testing.assert_close(branch[:4], ref, atol=2e-4, rtol=0)
    ref = _fresh_at(emu3, rows[0], tok[0, [0, 4, 5, 6]], [0, 9, 10, 11])
    torch.testing.assert_close(out.cond[0, 4:], ref[1:], atol=2e-4, rtol=0)
    ref = _fresh_at(emu3, rows[3], tok[1, :6], list(range(6)))
    torch.testing.assert_close(out.uncond[1, :6], ref, atol=2e-4, rtol=0)


def _emu3_prefix_allowed_tokens(batch_id: int, ids: torch.Tensor) -> list[int]:
    """Emu3's generation constraint as its model card writes it for `generate`, counted from the
    `<|image token|>` that closes the prompt (independent of our layout, which it checks)."""
    offset = len(ids) - int((ids == WRAPPER).nonzero()[0, 0])  # 1 for the first generated token
    body = H * (W + 1)
    if offset <= body:
        return [EOL] if offset % (W + 1) == 0 else list(range(CODE0, CODE0 + N_CODES))
    return {body + 1: [EOF], body + 2: [EOI], body + 3: [EOS]}.get(offset, [PAD])


def test_greedy_ar_equals_the_librarys_generate(emu3):
    """`model.generate` with Emu3's documented CFG (`negative_prompt_ids`, guidance_scale) and its
    prefix constraint. Differences from our pipeline, and why the comparison is still exact:
    - the library's UnbatchedClassifierFreeGuidanceLogitsProcessor mixes log-softmaxed logits,
      s * (log p_c - log p_u) + log p_u; ours mixes raw logits. The two differ by a constant per
      row, so softmax and arg-max are the same; its order (CFG, then the constraint) is ours;
    - it runs the negative branch as a second, unpadded forward with its own cache, while we pad
      and batch it; positions count from each row's first real token in both (generate derives
      them from the attention mask), so the logits agree to rounding;
    - we pass our negative row (negative prompt + the image prefix, as the official Emu3 script
      builds it) as `negative_prompt_ids`, so both branches see the same context."""
    ar = ARDecoder().generate(emu3, PROMPTS, GREEDY, gens(PROMPTS))
    rows = [emu3.row_ids(p.text + emu3.positive_suffix) for p in PROMPTS]
    T = max(len(r) for r in rows)
    input_ids = torch.tensor([[PAD] * (T - len(r)) + r for r in rows])
    attention_mask = (torch.arange(T)[None] >= torch.tensor([T - len(r) for r in rows])[:, None]).long()
    negative = torch.tensor([emu3.row_ids(NEGATIVE_PROMPT)] * len(PROMPTS))
    with torch.no_grad():
        out = emu3.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            negative_prompt_ids=negative,
            negative_prompt_attention_mask=torch.ones_like(negative),
            guidance_scale=GREEDY.cfg_scale,
            prefix_allowed_tokens_fn=_emu3_prefix_allowed_tokens,
            do_sample=False,
            max_new_tokens=N_TOKENS,
            eos_token_id=EOS,
            pad_token_id=PAD,
        )
    library = out[:, T:]
    assert library.shape == ar.tokens.shape
    assert torch.equal(library, ar.tokens)


@pytest.mark.parametrize(
    "decoder",
    [
        SJDDecoder(window=4),
        SJDDecoder(window=9, init="vertical"),
        JacobiDecoder(window=6),
        PJDDecoder(window=4, context=W),
    ],
    ids=["sjd4", "sjd9v", "jacobi6", "pjd-full-context"],
)
def test_greedy_speculative_decoders_equal_greedy_ar(emu3, decoder):
    ar = ARDecoder().generate(emu3, PROMPTS, GREEDY, gens(PROMPTS))
    res = decoder.generate(emu3, PROMPTS, GREEDY, gens(PROMPTS, seed=7))
    assert torch.equal(ar.tokens, res.tokens)
    assert [sum(a) for a in res.accepted] == [N_TOKENS] * len(PROMPTS)
    assert all(n < N_TOKENS for n in res.n_forward)  # windows did commit several tokens


@pytest.mark.parametrize("decoder", [ARDecoder(), SJDDecoder(window=8)], ids=["ar", "sjd"])
def test_special_tokens_sit_where_the_layout_says(emu3, decoder):
    tokens = decoder.generate(emu3, PROMPTS, SAMPLED, gens(PROMPTS)).tokens
    body = H * (W + 1)
    for r in range(H):
        assert (tokens[:, r * (W + 1) + W] == EOL).all()
    assert (tokens[:, body] == EOF).all() and (tokens[:, body + 1] == EOI).all() and (tokens[:, body + 2] == EOS).all()
    codes = tokens[:, :body].reshape(-1, H, W + 1)[..., :W]
    assert ((codes >= CODE0) & (codes < CODE0 + N_CODES)).all()


def test_a_prompts_tokens_do_not_depend_on_its_batch(emu3):
    """Left padding depends on the batch; the tokens must not."""
    batch = ARDecoder().generate(emu3, PROMPTS, SAMPLED, gens(PROMPTS)).tokens
    alone = ARDecoder().generate(emu3, PROMPTS[1:], SAMPLED, gens(PROMPTS[1:])).tokens
    assert torch.equal(batch[1:], alone)


def test_decode_images_gives_uint8_pixels(emu3):
    tokens = ARDecoder().generate(emu3, PROMPTS, SAMPLED, gens(PROMPTS)).tokens
    images = emu3.decode_images(tokens)
    factor = emu3.model.model.vqmodel.spatial_scale_factor
    assert images.shape == (2, H * factor, W * factor, 3) and images.dtype == np.uint8


def test_a_local_checkpoint_directory_loads_offline(tmp_path):
    """The real loading path: a saved transformers checkpoint (safetensors) plus its tokenizer."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = {chr(32 + i): TEXT0 + i for i in range(N_TEXT)}  # one id per printable character
    tok = Tokenizer(models.WordLevel({**chars, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path)
    model = tiny_emu3()
    model.save_pretrained(tmp_path)

    adapter = Emu3Adapter(weights=str(tmp_path), resolution=8, dtype="float32")
    assert (adapter.height, adapter.width) == (4, 4)  # 8 px / the tiny VQ's factor 2
    assert adapter.row_ids("ab") == [BOS, TEXT0 + 65, TEXT0 + 66, BOI, *[TEXT0 + ord(c) - 32 for c in "4*4"], WRAPPER]
    assert torch.equal(adapter.model.lm_head.weight, model.lm_head.weight)
    with pytest.raises(ValueError, match="resolution=9"):
        Emu3Adapter(weights=str(tmp_path), resolution=9)


def test_missing_weights_name_the_model_path_and_config_key(tmp_path):
    missing = tmp_path / "emu3-weights"
    with pytest.raises(FileNotFoundError, match="model.adapter.weights") as err:
        Emu3Adapter(weights=str(missing))
    assert "emu3" in str(err.value) and str(missing) in str(err.value)
    missing.mkdir()  # a directory without a checkpoint
    with pytest.raises(FileNotFoundError, match=r"config\.json.*model\.adapter\.weights"):
        Emu3Adapter(weights=str(missing))


def test_code_embeddings_are_the_vq_codebook_at_each_codes_id(emu3):
    table = emu3.code_embeddings()
    codebook = emu3.model.model.vqmodel.quantize.embedding.weight.detach().float()
    assert torch.equal(table[emu3.vocab.code_ids], codebook)
    assert table[~emu3.layout.free_tokens].abs().sum() == 0
