"""The Emu3 adapter on a tiny random `Emu3ForConditionalGeneration`: the adapter contract
(tests/adapter_contract.py) with CFG rows of different prompt lengths and AR against the library's
own `generate`; here, Emu3's prompt rows, layout and loading path."""

import pytest
import torch
from adapter_contract import (
    AdapterContract,
    DecodersOnAdapterContract,
    LibraryGenerateContract,
    LoadsWeightsContract,
    fresh_causal_lm,
)

from sjd.decoders.ar import ARDecoder
from sjd.decoders.jacobi import JacobiDecoder
from sjd.decoders.pjd import PJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.models.emu3 import NEGATIVE_PROMPT, Emu3Adapter
from sjd.types import Prompt

PAD, BOI, EOI, WRAPPER, EOL, EOF, BOS, EOS = 0, 2, 3, 4, 5, 6, 7, 8
TEXT0, N_TEXT = 10, 80  # character ids 10..89
CODE0, N_CODES = 100, 64  # visual token i is id 100 + i
H, W = 3, 5  # a non-square code grid
N_TOKENS = H * (W + 1) + 3
PROMPTS = [Prompt("p0", "a red fox in the snow"), Prompt("p1", "two cats")]


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


def cfg_rows(emu3) -> list[list[int]]:
    """The CFG batch's rows unpadded: each caption with the positive suffix, then the negative prompt."""
    return [emu3.row_ids(p.text + emu3.positive_suffix) for p in PROMPTS] + [emu3.row_ids(NEGATIVE_PROMPT)] * 2


def test_prompt_rows_and_layout_follow_emu3(emu3):
    ids, lengths = emu3.prompt_batch(PROMPTS, with_uncond=True)
    assert [ids[r, ids.shape[1] - n :].tolist() for r, n in enumerate(lengths)] == cfg_rows(emu3)
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


def _emu3_prefix_allowed_tokens(batch_id: int, ids: torch.Tensor) -> list[int]:
    """Emu3's generation constraint as its model card writes it for `generate`, counted from the
    `<|image token|>` that closes the prompt (independent of our layout, which it checks)."""
    offset = len(ids) - int((ids == WRAPPER).nonzero()[0, 0])  # 1 for the first generated token
    body = H * (W + 1)
    if offset <= body:
        return [EOL] if offset % (W + 1) == 0 else list(range(CODE0, CODE0 + N_CODES))
    return {body + 1: [EOF], body + 2: [EOI], body + 3: [EOS]}.get(offset, [PAD])


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


class TestEmu3(AdapterContract, DecodersOnAdapterContract, LibraryGenerateContract, LoadsWeightsContract):
    prompts = PROMPTS
    adapter_class, model_name = Emu3Adapter, "emu3"
    empty_checkpoint_detail = r"config\.json.*model\.adapter\.weights"
    greedy_decoders = {
        "sjd4": SJDDecoder(window=4),
        "sjd9v": SJDDecoder(window=9, init="vertical"),
        "jacobi6": JacobiDecoder(window=6),
        "pjd-full-context": PJDDecoder(window=4, context=W),
    }
    sampled_decoders = {"ar": ARDecoder(), "sjd8": SJDDecoder(window=8)}

    @pytest.fixture
    def adapter(self, emu3):
        return emu3

    def fresh_logits(self, adapter, row, generated, positions=None):
        return fresh_causal_lm(adapter.model, cfg_rows(adapter)[row], generated, positions)

    def image_size(self, adapter):
        factor = adapter.model.model.vqmodel.spatial_scale_factor
        return H * factor, W * factor

    def codebook(self, adapter):
        return CODE0 + torch.arange(N_CODES), adapter.model.model.vqmodel.quantize.embedding.weight

    def check_speed(self, name, sampling, result, n_tokens):
        if sampling.greedy:  # windows did commit several tokens
            assert all(n < n_tokens for n in result.n_forward)

    def library_greedy(self, emu3, sampling):
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
                guidance_scale=sampling.cfg_scale,
                prefix_allowed_tokens_fn=_emu3_prefix_allowed_tokens,
                do_sample=False,
                max_new_tokens=N_TOKENS,
                eos_token_id=EOS,
                pad_token_id=PAD,
            )
        return out[:, T:]
