"""The Lumina-mGPT and Anole adapters on a tiny random `ChameleonForConditionalGeneration` (CPU, fp32).

The adapter contract (tests/adapter_contract.py) runs on both; here are what only Chameleon has:
prompt and CFG rows, layouts, raw (unmasked) logits, the q/k-norm layout of Lumina's checkpoints,
its VQGAN, and its loading paths."""

import inspect

import numpy as np
import pytest
import torch
from adapter_contract import AdapterContract, DecodersOnAdapterContract, LoadsWeightsContract, gens
from safetensors.torch import load_file, save_file

from sjd.core.sampling import SamplingConfig
from sjd.decoders.ar import ARDecoder
from sjd.decoders.jacobi import JacobiDecoder
from sjd.decoders.pjd import PJDDecoder
from sjd.decoders.relaxed import RelaxedSJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.models.anole import AnoleAdapter
from sjd.models.chameleon import qk_norm_to_transformers, state_dict_to_transformers
from sjd.models.lumina import LuminaAdapter
from sjd.models.nets.chameleon_vqgan import ChameleonVQGAN, VQGANConfig
from sjd.types import Prompt

BOS, PAD, EOS = 0, 1, 2
CODE0, N_CODES = 4, 64  # image code i is id 4 + i, as in Chameleon's real vocabulary
EOI, BOI, EOT, EOL = 68, 69, 70, 71  # <eoss>, <racm3:break>, <reserved08706>, <reserved08799>
SIZE0 = 72  # <reserved0880g> (g = 1..6 grids) is id 71 + g
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
TEXT0 = 100  # character i of CHARS is id 100 + i
H_GRIDS, W_GRIDS = 2, 3  # Lumina: 4 x 6 codes, non-square
LUMINA_TOKENS = 3 + 4 * 7 + 2
ANOLE_H, ANOLE_W = 5, 4
ANOLE_TOKENS = 1 + ANOLE_H * ANOLE_W + 1
PROMPTS = [Prompt("p0", "a red fox in the snow"), Prompt("p1", "two cats")]
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)
VQ = VQGANConfig(n_embed=N_CODES, embed_dim=4, z_channels=8, ch=32, ch_mult=(1, 2), num_res_blocks=1, resolution=32)


def encode(text: str) -> list[int]:
    """A character tokenizer over the tiny vocabulary's text ids."""
    return [TEXT0 + CHARS.index(c) for c in text]


def code_name(i: int) -> str:
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(i)) + "Z"


def tiny_config():
    from transformers import ChameleonConfig

    vmap = {"<s>": BOS, "<pad>": PAD, "</s>": EOS, "<image>": 3, **{code_name(i): CODE0 + i for i in range(N_CODES)}}
    vmap |= {"<eoss>": EOI, "<racm3:break>": BOI, "<reserved08706>": EOT, "<reserved08799>": EOL}
    vmap |= {f"<reserved{8800 + g:05d}>": SIZE0 - 1 + g for g in range(1, 7)}
    return ChameleonConfig(
        vocab_size=TEXT0 + len(CHARS),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        vocabulary_map=vmap,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        vq_config=dict(embed_dim=8, num_embeddings=N_CODES, latent_channels=8, resolution=32, base_channels=32,
                       channel_multiplier=[1, 2], num_res_blocks=1, attn_resolutions=[]),
    )  # fmt: skip


def tiny_chameleon(seed: int = 0):
    """Random weights; q/k norms random too, each the same for all heads of a layer (one
    model-parallel shard, the shape Lumina's checkpoints store)."""
    from transformers import ChameleonForConditionalGeneration

    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(tiny_config()).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # spread the logits so that greedy ties cannot flip on rounding
        for name, p in model.named_parameters():
            if "_norm." in name and "self_attn" in name:
                row = (1.0 if name.endswith("weight") else 0.0) + 0.3 * torch.randn(p.shape[1])
                p.copy_(row.expand_as(p))
    return model


def tiny_vqgan() -> ChameleonVQGAN:
    torch.manual_seed(1)
    return ChameleonVQGAN(VQ).eval()


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lumina():
    return LuminaAdapter.from_model(tiny_chameleon(), encode, H_GRIDS, W_GRIDS, vqgan=tiny_vqgan())


@pytest.fixture(scope="module")
def anole():
    return AnoleAdapter.from_model(tiny_chameleon(seed=2), encode, ANOLE_H, ANOLE_W, vqgan=tiny_vqgan())


def fresh(model, row, generated, positions=None):
    """Uncached backbone + lm_head logits of one unpadded row + generated tokens (at generated
    `positions`, by default 0, 1, ...); output i predicts generated position i."""
    T = len(row)
    ids = torch.cat([torch.tensor(row), generated])[None]
    at = torch.arange(len(generated)) if positions is None else torch.as_tensor(positions)
    with torch.no_grad():
        hidden = model.model(input_ids=ids, position_ids=torch.cat([torch.arange(T), T + at])[None]).last_hidden_state
        return model.lm_head(hidden)[0, T - 1 :].float()


def lumina_row(text: str) -> list[int]:
    question = f"Generate an image of {32 * W_GRIDS}x{32 * H_GRIDS} according to the following prompt:\n{text}"
    return [BOS, *encode(question), EOT]


def anole_row(text: str) -> list[int]:
    return [BOS, *encode(f"Generate an image of {text}"), EOT]


# -- prompts and layouts -------------------------------------------------------------------------
def test_prompt_rows_and_the_sjd_unconditional_rows(lumina, anole):
    ids, lengths = lumina.prompt_batch(PROMPTS, with_uncond=True)
    rows = [lumina_row(p.text) for p in PROMPTS] + [[EOT], [EOT]]  # uncond: the last prompt token only
    assert lengths == [len(r) for r in rows]
    for row, real in zip(ids, rows):
        assert row[len(row) - len(real) :].tolist() == real
    assert anole.row_ids("a cat") == anole_row("a cat")


class CharTokenizer:
    """A tokenizer-shaped `encode`, with the BOS id a transformers tokenizer reports."""

    bos_token_id = BOS

    def encode(self, text, add_special_tokens=False):
        assert not add_special_tokens
        return encode(text)


def test_anole_takes_bos_from_the_tokenizer_not_the_config():
    """The released Anole config's bos_token_id is the pad token (1); the official prompt starts with
    the tokenizer's `<s>` (0), which the loader takes and from_model must take too."""
    model = tiny_chameleon()
    model.config.bos_token_id = PAD  # as in leloy/Anole-7b-v0.1-hf's config.json
    for tokenizer in (CharTokenizer(), encode):  # a callable has no BOS: `<s>` of the vocabulary_map
        adapter = AnoleAdapter.from_model(model, tokenizer, ANOLE_H, ANOLE_W)
        assert adapter.vocab.bos == BOS
        assert adapter.row_ids("a cat") == anole_row("a cat") and anole_row("a cat")[0] == BOS == 0
    del model.config.vocabulary_map["<s>"]
    with pytest.raises(ValueError, match="no BOS id"):
        AnoleAdapter.from_model(model, encode, ANOLE_H, ANOLE_W)


def test_layouts_force_every_special_token():
    lumina = LuminaAdapter.from_model(tiny_chameleon(), encode, H_GRIDS, W_GRIDS)
    expected = [BOI, SIZE0 - 1 + H_GRIDS, SIZE0 - 1 + W_GRIDS] + ([-1] * 6 + [EOL]) * 4 + [EOI, EOT]
    layout = lumina.layout
    assert layout.forced.tolist() == expected and layout.n_tokens == LUMINA_TOKENS
    assert (layout.height, layout.width, layout.row_stride, layout.first_code) == (4, 6, 7, 3)
    assert layout.free_token_ids.tolist() == list(range(CODE0, CODE0 + N_CODES))

    anole = AnoleAdapter.from_model(tiny_chameleon(), encode, ANOLE_H, ANOLE_W).layout
    assert anole.forced.tolist() == [BOI] + [-1] * ANOLE_H * ANOLE_W + [EOI]
    assert (anole.height, anole.width, anole.row_stride, anole.first_code) == (ANOLE_H, ANOLE_W, ANOLE_W, 1)


# -- logits and the cache ------------------------------------------------------------------------
def test_logits_are_the_backbone_through_lm_head_with_image_logits_unmasked(lumina):
    row = lumina_row(PROMPTS[0].text)
    with torch.no_grad():
        ours = lumina.prefill(PROMPTS[:1], with_uncond=False).cond[0, 0]
        library = lumina.model(input_ids=torch.tensor([row])).logits[0, -1].float()
    torch.testing.assert_close(ours, fresh(lumina.model, row, torch.empty(0, dtype=torch.long))[0], atol=1e-5, rtol=0)
    codes = torch.arange(CODE0, CODE0 + N_CODES)
    assert (library[codes] == torch.finfo(library.dtype).min).all()  # what the library's forward does
    assert ours[codes].std() > 1.0  # ours are real logits
    others = torch.ones(len(ours), dtype=torch.bool)
    others[codes] = False
    torch.testing.assert_close(ours[others], library[others], atol=1e-5, rtol=0)


# -- Lumina's q/k-norm layout --------------------------------------------------------------------
def test_qk_norm_shards_expand_to_their_heads():
    config = tiny_config()  # 4 query heads, 2 key/value heads, head_dim 16
    shards = torch.randn(2, 16)
    q = qk_norm_to_transformers("model.layers.0.self_attn.q_norm.weight", shards, config)
    k = qk_norm_to_transformers("model.layers.0.self_attn.k_norm.bias", shards, config)
    assert torch.equal(q, shards[[0, 0, 1, 1]]) and torch.equal(k, shards)
    with pytest.raises(ValueError, match=r"q_norm.*\(3, 16\)"):
        qk_norm_to_transformers("model.layers.0.self_attn.q_norm.weight", torch.randn(3, 16), config)


def lumina_shaped(state: dict) -> dict:
    """A state dict as Lumina's checkpoints store it: one q/k-norm row per (single) shard."""
    return {k: v[:1].clone() if "self_attn" in k and "_norm." in k else v for k, v in state.items()}


def test_a_lumina_shaped_state_dict_gives_the_same_outputs():
    from transformers import ChameleonForConditionalGeneration

    reference = tiny_chameleon()
    state = lumina_shaped(reference.state_dict())
    assert state["model.layers.0.self_attn.q_norm.weight"].shape == (1, 16)
    torch.manual_seed(5)
    model = ChameleonForConditionalGeneration(tiny_config()).eval()
    model.load_state_dict(state_dict_to_transformers(state, model.config), strict=True)
    ids = torch.tensor([lumina_row("a dog") + list(range(CODE0, CODE0 + 9))])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits, atol=0, rtol=0)


def _save_checkpoint(directory, model):
    """A transformers-format directory with Lumina's q/k-norm shape and a character tokenizer."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({**{c: TEXT0 + i for i, c in enumerate(CHARS)}, "[UNK]": 3}, "[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(directory)
    model.save_pretrained(directory)
    path = directory / "model.safetensors"
    save_file(lumina_shaped(load_file(path)), path, metadata={"format": "pt"})


def test_a_lumina_checkpoint_directory_loads_with_its_vqgan(tmp_path, lumina):
    weights, vq_dir = tmp_path / "lumina", tmp_path / "vqgan"
    _save_checkpoint(weights, lumina.model)
    vq_dir.mkdir()
    (vq_dir / "vqgan.yaml").write_text(
        "model:\n  params:\n    embed_dim: 4\n    n_embed: 64\n    ddconfig: {double_z: false, z_channels: 8, "
        "resolution: 32, in_channels: 3, out_ch: 3, ch: 32, ch_mult: [1, 2], num_res_blocks: 1, attn_resolutions: []}\n"
    )
    torch.save({"state_dict": lumina.vqgan.state_dict()}, vq_dir / "vqgan.ckpt")

    loaded = LuminaAdapter(weights=str(weights), vqgan=str(vq_dir), resolution=32 * H_GRIDS, dtype="float32")
    assert loaded.layout.height == 2 * H_GRIDS and loaded.row_ids("ab")[-3:] == [*encode("ab"), EOT]
    for key, p in lumina.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], p), key
    square = LuminaAdapter.from_model(lumina.model, encode, H_GRIDS, H_GRIDS, vqgan=lumina.vqgan)
    tokens = ARDecoder().generate(square, PROMPTS, SAMPLED, gens(PROMPTS)).tokens
    assert torch.equal(ARDecoder().generate(loaded, PROMPTS, SAMPLED, gens(PROMPTS)).tokens, tokens)
    assert np.array_equal(loaded.decode_images(tokens), square.decode_images(tokens))


# -- images --------------------------------------------------------------------------------------
def test_decode_images_reads_the_codes_and_maps_pixels_to_uint8(lumina):
    codes = torch.randint(0, N_CODES, (2, 4, 6), generator=torch.Generator().manual_seed(4))
    body = torch.cat([codes + CODE0, torch.full((2, 4, 1), EOL)], dim=2).flatten(1)
    head = torch.tensor([BOI, SIZE0 - 1 + H_GRIDS, SIZE0 - 1 + W_GRIDS]).expand(2, 3)
    tokens = torch.cat([head, body, torch.tensor([EOI, EOT]).expand(2, 2)], dim=1)
    assert torch.equal(lumina.image_codes(tokens), codes)
    images = lumina.decode_images(tokens)
    pixels = lumina.vqgan.decode_codes(codes).clamp(-1, 1)
    expected = ((pixels + 1) * 127.5).permute(0, 2, 3, 1).to(torch.uint8).numpy()
    assert images.shape == (2, 4 * VQ.factor, 6 * VQ.factor, 3) and images.dtype == np.uint8
    assert np.abs(images.astype(int) - expected.astype(int)).max() <= 1  # truncation of equal floats
    tokens[0, 3] = EOL  # a special where a code belongs
    with pytest.raises(ValueError, match="not an image code"):
        lumina.image_codes(tokens)


# -- loading errors and configs -------------------------------------------------------------------
def test_images_without_a_vqgan_name_the_config_key():
    with pytest.warns(UserWarning, match=r"model\.adapter\.vqgan"):
        assert LuminaAdapter.vqgan_from(None, "lumina", torch.device("cpu")) is None
    adapter = AnoleAdapter.from_model(tiny_chameleon(), encode, ANOLE_H, ANOLE_W)
    with pytest.raises(FileNotFoundError, match=r"model\.adapter\.vqgan"):
        adapter.decode_images(torch.full((1, ANOLE_TOKENS), CODE0))


@pytest.mark.parametrize("model, cls", [("lumina", LuminaAdapter), ("anole", AnoleAdapter)])
def test_model_configs_match_their_adapter(compose_cfg, model, cls):
    cfg = compose_cfg([f"model={model}"])
    adapter = dict(cfg.model.adapter)
    assert adapter.pop("_target_") == f"{cls.__module__}.{cls.__name__}"
    inspect.signature(cls).bind(**adapter, device="cpu")  # every key is a constructor argument
    # The official paths' top-k: Lumina-mGPT's scripts pass 2000; SJD's Anole path passes none, so
    # transformers' default 50 applies (conf/model/anole.yaml).
    assert cfg.model.sampling.cfg_scale == 3.0 and cfg.model.sampling.top_k == {"lumina": 2000, "anole": 50}[model]


# -- the adapter contract --------------------------------------------------------------------------
class ChameleonContract(AdapterContract, DecodersOnAdapterContract, LoadsWeightsContract):
    """What Lumina and Anole share: prompt rows built here from the spec, the one-token
    unconditional row, and the VQGAN's codebook at ids CODE0 + i."""

    prompts = PROMPTS
    sampled = SAMPLED
    empty_checkpoint_detail = r"config\.json.*model\.adapter\.weights"

    def row(self, text: str) -> list[int]:
        raise NotImplementedError

    def fresh_logits(self, adapter, row, generated, positions=None):
        B = len(self.prompts)
        ids = self.row(self.prompts[row].text) if row < B else [EOT]  # uncond: the last prompt token only
        return fresh(adapter.model, ids, generated, positions)

    def codebook(self, adapter):
        return CODE0 + torch.arange(N_CODES), adapter.vqgan.quantize.embedding.weight


class TestLumina(ChameleonContract):
    adapter_class, model_name = LuminaAdapter, "lumina"
    greedy_decoders = {
        "sjd4": SJDDecoder(window=4),
        "sjd9v": SJDDecoder(window=9, init="vertical"),
        "jacobi6": JacobiDecoder(window=6),
        "pjd-full-row-context": PJDDecoder(window=4, context=6),
    }
    sampled_decoders = {
        "ar": ARDecoder(),
        "sjd8": SJDDecoder(window=8),
        "gsd-wide": RelaxedSJDDecoder(window=6, acceptance="gsd", neighbours=4, p_tol=1.0),
    }

    @pytest.fixture
    def adapter(self, lumina):
        return lumina

    def row(self, text):
        return lumina_row(text)

    def image_size(self, adapter):
        return 4 * VQ.factor, 6 * VQ.factor

    def check_speed(self, name, sampling, result, n_tokens):
        if sampling.greedy:  # the forced end-of-line tokens give drafts to accept
            assert all(n < n_tokens for n in result.n_forward)


class TestAnole(ChameleonContract):
    """A random model with no forced token inside the image almost never matches a draft, so the
    greedy windows mostly commit one token (Lumina shows multi-token commits). Anole has no
    end-of-line token: with context = the width, row r is anchored on row r-1's committed last
    code, and PJD equals AR; with context 2 a row starts on a draft of the last code above."""

    adapter_class, model_name = AnoleAdapter, "anole"
    greedy_decoders = {
        "sjd5": SJDDecoder(window=5),
        "jacobi4": JacobiDecoder(window=4),
        "pjd-full-row-context": PJDDecoder(window=3, context=ANOLE_W),
        "pjd-full-row-context-vertical": PJDDecoder(window=3, context=ANOLE_W, init="vertical"),
    }
    sampled_decoders = {
        "ar": ARDecoder(),
        "sjd8": SJDDecoder(window=8),
        "pjd-short-context": PJDDecoder(window=3, context=2),
    }

    @pytest.fixture
    def adapter(self, anole):
        return anole

    def row(self, text):
        return anole_row(text)

    def image_size(self, adapter):
        return ANOLE_H * VQ.factor, ANOLE_W * VQ.factor

    def check_speed(self, name, sampling, result, n_tokens):
        if name == "pjd-short-context":  # the rows overlap: fewer forwards than AR's one per token
            assert all(n < n_tokens for n in result.n_forward)
