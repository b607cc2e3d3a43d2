"""The Lumina-mGPT and Anole adapters on a tiny random `ChameleonForConditionalGeneration` (CPU, fp32):
prompt and CFG rows, layouts, raw (unmasked) logits, cache equivalence, the q/k-norm layout of
Lumina's checkpoints, greedy speculative decoders against AR, image decoding and loading errors."""

import inspect

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from sjd.core.sampling import SamplingConfig
from sjd.decoders.ar import ARDecoder
from sjd.decoders.jacobi import JacobiDecoder
from sjd.decoders.pjd import PJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.provenance import make_generators
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
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
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


def gens(prompts, seed=0):
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


def fresh(model, row, generated):
    """Uncached backbone + lm_head logits of one unpadded row + generated tokens; output i
    predicts generated position i."""
    ids = torch.cat([torch.tensor(row), generated])[None]
    with torch.no_grad():
        return model.lm_head(model.model(input_ids=ids).last_hidden_state)[0, len(row) - 1 :].float()


def lumina_row(text: str) -> list[int]:
    question = f"Generate an image of {32 * W_GRIDS}x{32 * H_GRIDS} according to the following prompt:\n{text}"
    return [BOS, *encode(question), EOT]


# -- prompts and layouts -------------------------------------------------------------------------
def test_prompt_rows_and_the_sjd_unconditional_rows(lumina, anole):
    ids, lengths = lumina.prompt_batch(PROMPTS, with_uncond=True)
    rows = [lumina_row(p.text) for p in PROMPTS] + [[EOT], [EOT]]  # uncond: the last prompt token only
    assert lengths == [len(r) for r in rows]
    for row, real in zip(ids, rows):
        assert row[len(row) - len(real) :].tolist() == real
    assert anole.row_ids("a cat") == [BOS, *encode("Generate an image of a cat"), EOT]


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


def test_cached_windows_match_fresh_computations_with_cfg_rows(lumina):
    rows = [lumina_row(p.text) for p in PROMPTS] + [[EOT], [EOT]]
    seq = torch.randint(CODE0, CODE0 + N_CODES, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first = lumina.prefill(PROMPTS, with_uncond=True)
        none = torch.empty(0, dtype=torch.long)
        for b in range(2):
            torch.testing.assert_close(first.cond[b, 0], fresh(lumina.model, rows[b], none)[0], atol=2e-4, rtol=0)
            torch.testing.assert_close(first.uncond[b, 0], fresh(lumina.model, [EOT], none)[0], atol=2e-4, rtol=0)
        out = lumina.forward(seq[:, :12], [0, 0])
        for b in range(2):
            torch.testing.assert_close(out.cond[b], fresh(lumina.model, rows[b], seq[b, :12])[1:], atol=2e-4, rtol=0)
            torch.testing.assert_close(out.uncond[b], fresh(lumina.model, [EOT], seq[b, :12])[1:], atol=2e-4, rtol=0)
        lumina.truncate([5, 9])  # ragged rows: 5 and 9 generated positions kept
        window = torch.stack([seq[0, 5:11], seq[1, 9:15]])
        out = lumina.forward(window, [5, 9])
        for b, n in enumerate([5, 9]):
            gen = torch.cat([seq[b, :n], window[b]])
            torch.testing.assert_close(out.cond[b], fresh(lumina.model, rows[b], gen)[n + 1 :], atol=2e-4, rtol=0)
            torch.testing.assert_close(out.uncond[b], fresh(lumina.model, [EOT], gen)[n + 1 :], atol=2e-4, rtol=0)


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


# -- decoders ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "decoder",
    [SJDDecoder(window=4), SJDDecoder(window=9, init="vertical"), JacobiDecoder(window=6), PJDDecoder(4, 4, 6)],
    ids=["sjd4", "sjd9v", "jacobi6", "pjd-full-row-context"],
)
def test_lumina_greedy_speculative_decoders_equal_greedy_ar(lumina, decoder):
    ar = ARDecoder().generate(lumina, PROMPTS, GREEDY, gens(PROMPTS))
    res = decoder.generate(lumina, PROMPTS, GREEDY, gens(PROMPTS, seed=7))
    assert torch.equal(ar.tokens, res.tokens)
    assert [sum(a) for a in res.accepted] == [LUMINA_TOKENS] * len(PROMPTS)
    assert all(n < LUMINA_TOKENS for n in res.n_forward)  # windows did commit several tokens


@pytest.mark.parametrize("decoder", [SJDDecoder(window=5), JacobiDecoder(window=4)], ids=["sjd5", "jacobi4"])
def test_anole_greedy_speculative_decoders_equal_greedy_ar(anole, decoder):
    """Every forward is a multi-token window against the cache. (A random model with no forced
    token inside the image almost never matches a draft, so the windows mostly commit one token;
    the Lumina test above shows multi-token commits.)"""
    ar = ARDecoder().generate(anole, PROMPTS, GREEDY, gens(PROMPTS))
    res = decoder.generate(anole, PROMPTS, GREEDY, gens(PROMPTS, seed=3))
    assert torch.equal(ar.tokens, res.tokens)
    assert [sum(a) for a in res.accepted] == [ANOLE_TOKENS] * len(PROMPTS)


@pytest.mark.parametrize("init", ["random", "vertical"])
def test_anole_greedy_pjd_with_full_row_context_equals_greedy_ar(anole, init):
    """Anole has no end-of-line token: row r is anchored on row r-1's last code, which is committed when a row
    starts only after the row above is complete (context = the width)."""
    ar = ARDecoder().generate(anole, PROMPTS, GREEDY, gens(PROMPTS))
    res = PJDDecoder(window=3, context=ANOLE_W, init=init).generate(anole, PROMPTS, GREEDY, gens(PROMPTS, seed=3))
    assert torch.equal(ar.tokens, res.tokens)
    assert [sum(a) for a in res.accepted] == [ANOLE_TOKENS] * len(PROMPTS)


def test_anole_pjd_with_a_short_context_keeps_the_grammar(anole):
    """Context 2: a row starts on a draft of the last code above. Begin/end of image stay forced, every code
    is an image code committed once, the rows overlap (fewer forwards than AR's one per token, although this
    random model rarely accepts a draft), and a prompt's tokens do not depend on its batch."""
    pjd = PJDDecoder(window=3, context=2)
    res = pjd.generate(anole, PROMPTS, SAMPLED, gens(PROMPTS))
    tokens = res.tokens
    assert (tokens[:, 0] == BOI).all() and (tokens[:, -1] == EOI).all()
    assert ((tokens[:, 1:-1] >= CODE0) & (tokens[:, 1:-1] < CODE0 + N_CODES)).all()
    assert [sum(a) for a in res.accepted] == [ANOLE_TOKENS] * len(PROMPTS)
    assert all(n < ANOLE_TOKENS for n in res.n_forward)  # AR: the prefill + ANOLE_TOKENS - 1 forwards
    assert torch.equal(pjd.generate(anole, PROMPTS[1:], SAMPLED, gens(PROMPTS[1:])).tokens, tokens[1:])


@pytest.mark.parametrize("decoder", [ARDecoder(), SJDDecoder(window=8)], ids=["ar", "sjd"])
def test_special_tokens_sit_where_the_layout_says(lumina, anole, decoder):
    tokens = decoder.generate(lumina, PROMPTS, SAMPLED, gens(PROMPTS)).tokens
    assert (tokens[:, :3] == torch.tensor([BOI, SIZE0 - 1 + H_GRIDS, SIZE0 - 1 + W_GRIDS])).all()
    grid = tokens[:, 3:-2].reshape(2, 4, 7)
    assert (grid[..., 6] == EOL).all() and ((grid[..., :6] >= CODE0) & (grid[..., :6] < CODE0 + N_CODES)).all()
    assert (tokens[:, -2] == EOI).all() and (tokens[:, -1] == EOT).all()

    tokens = decoder.generate(anole, PROMPTS, SAMPLED, gens(PROMPTS)).tokens
    assert (tokens[:, 0] == BOI).all() and (tokens[:, -1] == EOI).all()
    assert ((tokens[:, 1:-1] >= CODE0) & (tokens[:, 1:-1] < CODE0 + N_CODES)).all()


def test_a_prompts_tokens_do_not_depend_on_its_batch(lumina):
    batch = SJDDecoder(window=6).generate(lumina, PROMPTS, SAMPLED, gens(PROMPTS)).tokens
    alone = SJDDecoder(window=6).generate(lumina, PROMPTS[1:], SAMPLED, gens(PROMPTS[1:])).tokens
    assert torch.equal(batch[1:], alone)


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


def test_code_embeddings_are_the_vqgan_codebook_at_each_codes_id_and_gsd_runs(lumina):
    from sjd.decoders.relaxed import RelaxedSJDDecoder

    table = lumina.code_embeddings()
    codebook = lumina.vqgan.quantize.embedding.weight
    assert torch.equal(table[CODE0 + torch.arange(N_CODES)], codebook.detach().float())
    gsd = RelaxedSJDDecoder(window=6, acceptance="gsd", neighbours=4, p_tol=1.0)
    gsd.check(lumina)
    tokens = gsd.generate(lumina, PROMPTS, SAMPLED, gens(PROMPTS)).tokens
    forced = lumina.layout.forced
    assert (tokens[:, forced >= 0] == forced[forced >= 0]).all()


# -- loading errors and configs -------------------------------------------------------------------
@pytest.mark.parametrize("adapter, name", [(LuminaAdapter, "lumina"), (AnoleAdapter, "anole")])
def test_missing_weights_name_the_model_path_and_config_key(tmp_path, adapter, name):
    missing = tmp_path / f"{name}-weights"
    with pytest.raises(FileNotFoundError, match=r"model\.adapter\.weights") as err:
        adapter(weights=str(missing))
    assert name in str(err.value) and str(missing) in str(err.value)
    missing.mkdir()
    with pytest.raises(FileNotFoundError, match=r"config\.json.*model\.adapter\.weights"):
        adapter(weights=str(missing))


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
    assert cfg.model.sampling.cfg_scale == 3.0 and cfg.model.sampling.top_k == 2000
