"""The LlamaGen adapter on tiny random parts (CPU, fp32): our GPT (6x6 = 36 codes from a 64-code vocabulary,
8 caption slots), a tiny T5 encoder with a word-level tokenizer, and a tiny Janus VQ (factor 2: 12 px). The
adapter contract (tests/adapter_contract.py) runs on it; here, LlamaGen's captions, 2-D RoPE, checkpoint names
and loading paths."""

import argparse

import numpy as np
import pytest
import torch
from adapter_contract import AdapterContract, DecodersOnAdapterContract, LoadsWeightsContract, MissingWeights
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import JanusVQVAE, PreTrainedTokenizerFast, T5Config, T5EncoderModel

from sjd.core.sampling import SamplingConfig
from sjd.decoders.jacobi import JacobiDecoder
from sjd.decoders.pjd import PJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.models.llamagen import GPT_KEY, T5_KEY, VQ_KEY, LlamaGenAdapter
from sjd.models.nets.llamagen_gpt import LlamaGenConfig, LlamaGenGPT, apply_rope, load_gpt, rope_2d_table
from sjd.models.nets.llamagen_vq import load_vq, vq_config
from sjd.types import Prompt

GRID, CODES, CAPTION_SLOTS, CAPTION_DIM = 6, 64, 8, 16
N = GRID * GRID
GPT_FIELDS = dict(
    dim=64, n_layer=2, n_head=4, multiple_of=32, vocab_size=CODES, caption_dim=CAPTION_DIM, cls_token_num=CAPTION_SLOTS
)
VQ_FIELDS = dict(
    base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1, latent_channels=32, embed_dim=8, num_embeddings=CODES
)
WORDS = "a red cat blue dog sits on the mat under grey sky".split()
PAD, EOS, UNK = 0, 1, 2
# "a red cat" + </s> fills 4 of the 8 caption slots; the long caption is truncated to 7 words + </s>.
PROMPTS = [Prompt("short", "A Red cat"), Prompt("long", "a blue dog sits on the mat under a grey sky")]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_gpt(seed: int = 3) -> LlamaGenGPT:
    torch.manual_seed(seed)
    gpt = LlamaGenGPT(LlamaGenConfig.build(GPT_FIELDS, grid_size=GRID)).eval()
    # Matrices at unit scale (N(0, 1/fan_in)) and small code embeddings: the codes then steer the model enough
    # for a varied image, yet not so much that greedy Jacobi never converges ahead (drafts get accepted).
    with torch.no_grad():
        for name, weight in gpt.named_parameters():
            if weight.dim() == 2 and name != "tok_embeddings.weight":
                weight.normal_(0.0, weight.shape[1] ** -0.5)
        gpt.tok_embeddings.weight.mul_(0.1)
    return gpt


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": PAD, "</s>": EOS, "<unk>": UNK, **{w: 3 + i for i, w in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def tiny_t5() -> T5EncoderModel:
    torch.manual_seed(1)
    config = T5Config(
        vocab_size=16, d_model=CAPTION_DIM, d_kv=8, d_ff=32, num_layers=1, num_heads=2, pad_token_id=PAD,
        eos_token_id=EOS, decoder_start_token_id=PAD, dropout_rate=0.0,
    )  # fmt: skip
    return T5EncoderModel(config).eval()


def tiny_vq() -> JanusVQVAE:
    torch.manual_seed(2)
    return JanusVQVAE(vq_config(VQ_FIELDS, GRID)).eval()


@pytest.fixture(scope="module")
def parts():
    return tiny_gpt(), tiny_tokenizer(), tiny_t5(), tiny_vq()


@pytest.fixture(scope="module")
def llamagen(parts):
    return LlamaGenAdapter.from_parts(*parts)


@torch.no_grad()
def fresh(gpt: LlamaGenGPT, caption: torch.Tensor, mask: torch.Tensor, codes: torch.Tensor, at=None) -> torch.Tensor:
    """Uncached logits of one row built without any padding: only the real caption slots, then the codes, at
    their slot positions (real caption slots keep theirs; code g, at generated position at[g] (default g), sits
    at cls_token_num + at[g]). Row g predicts generated position g. Equality with the padded, cached path shows
    the padding is invisible."""
    real = mask.nonzero().flatten()
    cls = gpt.config.cls_token_num
    at = torch.arange(len(codes)) if at is None else torch.as_tensor(at)
    positions = torch.cat([real, cls + at])
    embeds = torch.cat([caption[real], gpt.tok_embeddings(codes)])
    return gpt(embeds[None], positions=positions[None])[0, len(real) - 1 :]


def test_layout_is_the_bare_code_grid(llamagen):
    lay = llamagen.layout
    assert (lay.n_tokens, lay.height, lay.width, lay.row_stride, lay.first_code) == (N, GRID, GRID, GRID, 0)
    assert (lay.forced == -1).all() and lay.free_tokens.all() and lay.vocab_size == CODES


def test_captions_are_left_padded_t5_features_and_cfg_rows_use_the_null_caption(llamagen, parts):
    gpt, tokenizer, t5, _ = parts
    features, mask = llamagen.encode_captions([p.text for p in PROMPTS])
    assert mask.tolist() == [[False] * 4 + [True] * 4, [True] * 8]
    ids = torch.tensor([[3, 4, 5, EOS]])  # "a red cat </s>": the caption is lower-cased first
    with torch.no_grad():
        direct = t5(input_ids=ids).last_hidden_state[0]
    torch.testing.assert_close(features[0, 4:], direct, atol=1e-5, rtol=0)
    assert (features[0, :4] == 0).all()

    embeds, rows_mask = llamagen.caption_rows(PROMPTS, with_uncond=True)
    with torch.no_grad():
        null = gpt.cls_embedding.cap_proj(gpt.cls_embedding.uncond_embedding)
        torch.testing.assert_close(embeds[:2], gpt.cls_embedding.cap_proj(features))
    torch.testing.assert_close(embeds[2], null)
    torch.testing.assert_close(embeds[3], null)
    assert torch.equal(rows_mask, torch.cat([mask, mask]))  # uncond rows keep their cond row's padding mask


def test_rope_2d_matches_a_hand_computation():
    """LlamaGen's 2-D RoPE written out per element: pair j < head_dim/4 turns by row * base^(-4j/head_dim), pair
    head_dim/4 + j by column * the same frequency; caption slots have cos = sin = 0 (their q and k vanish)."""
    head_dim, grid, base, cls = 16, 3, 100.0, 2
    table = rope_2d_table(grid, head_dim, base, cls)
    assert table.shape == (cls + grid * grid, head_dim // 2, 2) and (table[:cls] == 0).all()
    x = torch.randn(1, cls + grid * grid, 2, head_dim, generator=torch.Generator().manual_seed(0))
    out = apply_rope(x, table[None])
    quarter = head_dim // 4
    for slot in range(cls + grid * grid):
        for j in range(head_dim // 2):
            if slot < cls:
                c = s = 0.0
            else:
                y, col = divmod(slot - cls, grid)
                angle = (y if j < quarter else col) * base ** (-2 * (j % quarter) / (head_dim // 2))
                c, s = np.cos(angle), np.sin(angle)
            a, b = x[0, slot, :, 2 * j], x[0, slot, :, 2 * j + 1]
            torch.testing.assert_close(out[0, slot, :, 2 * j], a * c - b * s, atol=1e-5, rtol=0)
            torch.testing.assert_close(out[0, slot, :, 2 * j + 1], b * c + a * s, atol=1e-5, rtol=0)


def release_gpt_shapes(dim, n_layer, n_head, vocab, caption_dim, cls_tokens, multiple_of=256):
    """The state dict of the release's `Transformer` (t2i), read off autoregressive/models/gpt.py."""
    ffn = int(2 * 4 * dim / 3)
    ffn = ffn if ffn % multiple_of == 0 else ffn + multiple_of - ffn % multiple_of
    shapes = {
        "cls_embedding.uncond_embedding": (cls_tokens, caption_dim),
        "cls_embedding.cap_proj.fc1.weight": (dim, caption_dim),
        "cls_embedding.cap_proj.fc2.weight": (dim, dim),
        "tok_embeddings.weight": (vocab, dim),
        "norm.weight": (dim,),
        "output.weight": (vocab, dim),
    }
    for n in range(n_layer):
        shapes |= {
            f"layers.{n}.attention.wqkv.weight": (3 * dim, dim),  # n_kv_head = n_head
            f"layers.{n}.attention.wo.weight": (dim, dim),
            f"layers.{n}.feed_forward.w1.weight": (ffn, dim),
            f"layers.{n}.feed_forward.w3.weight": (ffn, dim),
            f"layers.{n}.feed_forward.w2.weight": (dim, ffn),
            f"layers.{n}.attention_norm.weight": (dim,),
            f"layers.{n}.ffn_norm.weight": (dim,),
        }
    return shapes


def test_gpt_state_dict_has_the_release_names_and_loads_strictly(tmp_path, llamagen):
    with torch.device("meta"):
        xl = LlamaGenGPT(LlamaGenConfig.build("GPT-XL"))
    shapes = {k: tuple(v.shape) for k, v in xl.state_dict().items()}
    assert shapes == release_gpt_shapes(1280, 36, 20, 16384, 2048, 120)
    assert 770e6 < sum(v.numel() for v in xl.parameters()) < 780e6  # "775M" in the release table

    gpt = llamagen.gpt
    sd = gpt.state_dict()
    assert {k: tuple(v.shape) for k, v in sd.items()} == release_gpt_shapes(64, 2, 4, CODES, CAPTION_DIM, 8, 32)
    # As the training script saves it: weights under "model", next to the optimizer step and the argparse args.
    torch.save({"model": sd, "steps": 10, "args": argparse.Namespace(gpt_model="GPT-XL")}, tmp_path / "gpt.pt")
    loaded = load_gpt(tmp_path / "gpt.pt", gpt.config)
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in sd.items())
    ids = torch.arange(12)[None]
    torch.testing.assert_close(loaded(loaded.tok_embeddings(ids)), gpt(gpt.tok_embeddings(ids)))

    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "gpt.safetensors")
    assert torch.equal(load_gpt(tmp_path / "gpt.safetensors", gpt.config).output.weight, gpt.output.weight)
    del sd["layers.1.feed_forward.w2.weight"]
    torch.save({"model": sd}, tmp_path / "broken.pt")
    with pytest.raises(ValueError, match=r"layers\.1\.feed_forward\.w2\.weight"):
        load_gpt(tmp_path / "broken.pt", gpt.config)


def release_vq_shapes(ch, ch_mult, n_res, z, embed, n_codes):
    """The state dict of the release's `VQModel`, read off tokenizer/tokenizer_image/vq_model.py."""
    shapes = {}

    def conv(name, cout, cin, k):
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (cout, cin, k, k), (cout,)

    def norm(name, c):
        shapes[f"{name}.weight"] = shapes[f"{name}.bias"] = (c,)

    def res(name, cin, cout):
        norm(f"{name}.norm1", cin), conv(f"{name}.conv1", cout, cin, 3), norm(f"{name}.norm2", cout)
        conv(f"{name}.conv2", cout, cout, 3)
        if cin != cout:
            conv(f"{name}.nin_shortcut", cout, cin, 1)

    def attn(name, c):
        norm(f"{name}.norm", c)
        for part in ("q", "k", "v", "proj_out"):
            conv(f"{name}.{part}", c, c, 1)

    def mid(part, c):
        res(f"{part}.mid.0", c, c), attn(f"{part}.mid.1", c), res(f"{part}.mid.2", c, c)

    levels = len(ch_mult)
    conv("encoder.conv_in", ch, 3, 3)
    c = ch
    for i, m in enumerate(ch_mult):
        for j in range(n_res):
            res(f"encoder.conv_blocks.{i}.res.{j}", c, ch * m)
            c = ch * m
            if i == levels - 1:
                attn(f"encoder.conv_blocks.{i}.attn.{j}", c)
        if i != levels - 1:
            conv(f"encoder.conv_blocks.{i}.downsample.conv", c, c, 3)
    mid("encoder", c), norm("encoder.norm_out", c), conv("encoder.conv_out", z, c, 3)
    c = ch * ch_mult[-1]
    conv("decoder.conv_in", c, z, 3)
    mid("decoder", c)
    for k, level in enumerate(reversed(range(levels))):
        for j in range(n_res + 1):
            res(f"decoder.conv_blocks.{k}.res.{j}", c, ch * ch_mult[level])
            c = ch * ch_mult[level]
            if level == levels - 1:
                attn(f"decoder.conv_blocks.{k}.attn.{j}", c)
        if level != 0:
            conv(f"decoder.conv_blocks.{k}.upsample.conv", c, c, 3)
    norm("decoder.norm_out", c), conv("decoder.conv_out", 3, c, 3)
    shapes["quantize.embedding.weight"], shapes["quantize.codebook_used"] = (n_codes, embed), (65536,)
    conv("quant_conv", embed, z, 1), conv("post_quant_conv", z, embed, 1)
    return shapes


def test_vq_loads_the_release_names_after_the_rename(tmp_path, llamagen):
    shapes = release_vq_shapes(32, [1, 2], 1, 32, 8, CODES)
    gen = torch.Generator().manual_seed(4)
    sd = {k: torch.randn(s, generator=gen) * 0.1 for k, s in shapes.items()}
    torch.save({"model": sd}, tmp_path / "vq.pt")
    vq = load_vq(tmp_path / "vq.pt", vq_config(VQ_FIELDS, GRID))  # strict: every tensor found a home
    got = vq.state_dict()
    assert len(got) == len(sd) - 1  # codebook_used is a training statistic
    pairs = {
        "decoder.conv_blocks.1.res.0.nin_shortcut.weight": "decoder.up.1.block.0.nin_shortcut.weight",
        "decoder.conv_blocks.0.attn.1.proj_out.weight": "decoder.up.0.attn.1.proj_out.weight",
        "decoder.conv_blocks.0.upsample.conv.bias": "decoder.up.0.upsample.conv.bias",
        "encoder.conv_blocks.0.downsample.conv.weight": "encoder.down.0.downsample.conv.weight",
        "decoder.mid.1.q.weight": "decoder.mid.attn_1.q.weight",
        "encoder.mid.2.conv2.bias": "encoder.mid.block_2.conv2.bias",
    }
    for theirs, ours in pairs.items():
        assert torch.equal(sd[theirs], got[ours]), theirs

    adapter = LlamaGenAdapter.from_parts(llamagen.gpt, llamagen.tokenizer, llamagen.text_encoder, vq)
    codes = torch.randint(0, CODES, (3, N), generator=gen)
    images = adapter.decode_images(codes, chunk=2)
    assert images.shape == (3, 2 * GRID, 2 * GRID, 3) and images.dtype == np.uint8 and images.std() > 0
    assert not np.array_equal(images[0], images[1])


def test_checkpoint_files_load_through_the_constructor(tmp_path, llamagen, parts):
    """The real path: GPT and VQ .pt files (weights under "model", the VQ in the release's names), a T5
    directory with its tokenizer."""
    gpt, tokenizer, t5, _ = parts
    torch.save({"model": gpt.state_dict()}, tmp_path / "gpt.pt")
    gen = torch.Generator().manual_seed(5)
    vq_sd = {k: torch.randn(s, generator=gen) * 0.1 for k, s in release_vq_shapes(32, [1, 2], 1, 32, 8, CODES).items()}
    torch.save({"model": vq_sd}, tmp_path / "vq.pt")
    t5.save_pretrained(tmp_path / "t5")
    tokenizer.save_pretrained(tmp_path / "t5")
    kwargs = dict(weights=str(tmp_path / "gpt.pt"), vq_weights=str(tmp_path / "vq.pt"), t5=str(tmp_path / "t5"))
    kwargs |= dict(gpt_model=GPT_FIELDS, vq_model=VQ_FIELDS, dtype="float32")
    loaded = LlamaGenAdapter(resolution=2 * GRID, **kwargs)
    assert loaded.layout.n_tokens == N and loaded.pixels == 2 * GRID
    with torch.no_grad():
        ours, ref = loaded.prefill(PROMPTS, with_uncond=True), llamagen.prefill(PROMPTS, with_uncond=True)
    torch.testing.assert_close(ours.cond, ref.cond)
    torch.testing.assert_close(ours.uncond, ref.uncond)
    assert torch.equal(loaded.vq.decoder.conv_out.weight, vq_sd["decoder.conv_out.weight"])
    with pytest.raises(ValueError, match="model.adapter.resolution=13"):
        LlamaGenAdapter(resolution=13, **kwargs)


class TestLlamaGen(AdapterContract, DecodersOnAdapterContract, LoadsWeightsContract):
    """The contract's greedy check is LlamaGen's `generate` written out: every step recomputes the cond
    row (caption) and the uncond row (null caption, same padding mask) from scratch. No end-of-line
    token: with context = the width PJD equals AR; with context 2 a row starts on a draft anchor."""

    prompts = PROMPTS
    atol = 1e-4
    min_distinct_codes = 7  # greedy AR is not a degenerate, repetitive image
    sampled = SamplingConfig(cfg_scale=7.5, temperature=1.0, top_k=20)
    adapter_class, model_name = LlamaGenAdapter, "llamagen"
    greedy_decoders = {
        "sjd8": SJDDecoder(window=8),
        "sjd12v": SJDDecoder(window=12, init="vertical"),
        "jacobi8": JacobiDecoder(window=8),
        "pjd4-full-context": PJDDecoder(window=4, context=GRID),
        "pjd8v-full-context": PJDDecoder(window=8, context=GRID, init="vertical"),
    }
    sampled_decoders = {
        "sjd8": SJDDecoder(window=8),
        "pjd-short-context": PJDDecoder(window=4, context=2),
        # position 0 is a code here: the row below draws from the distribution it was committed from
        "sjd-block-vertical-dist": SJDDecoder(window=8, init="vertical_dist", verification="block"),
    }

    @pytest.fixture
    def adapter(self, llamagen):
        return llamagen

    def fresh_logits(self, adapter, row, generated, positions=None):
        captions, masks = adapter.caption_rows(self.prompts, with_uncond=True)
        return fresh(adapter.gpt, captions[row], masks[row], generated, positions)

    def image_size(self, adapter):
        return 2 * GRID, 2 * GRID

    def decode(self, adapter, tokens):
        return adapter.decode_images(tokens, chunk=2)  # 3 images: chunks of 2 and 1

    def codebook(self, adapter):
        return torch.arange(CODES), adapter.vq.quantize.embedding.weight

    def check_speed(self, name, sampling, result, n_tokens):
        if sampling.greedy and name in ("sjd8", "sjd12v", "jacobi8"):  # drafts were accepted
            assert sum(result.n_forward) < 2 * n_tokens and max(max(a) for a in result.accepted) > 2
        if name == "pjd-short-context":  # the rows overlap: AR takes N forwards
            assert all(n < n_tokens - GRID for n in result.n_forward)

    def missing_weights(self, tmp_path, monkeypatch):
        """Each of the three checkpoints, and a hub file that cannot be fetched offline."""
        import huggingface_hub

        def offline(**_):
            raise OSError("offline, and not in the local cache")

        monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
        present = tmp_path / "present.pt"
        present.write_bytes(b"")
        gpt, vq, t5 = tmp_path / "t2i_XL.pt", tmp_path / "vq16.pt", tmp_path / "t5"
        empty_t5 = tmp_path / "empty_t5"
        empty_t5.mkdir()
        hub = "peizesun/llamagen_t2i/x.pt"
        offline_hub = r"'llamagen'.*peizesun/llamagen_t2i/x\.pt.*model\.adapter\.weights"
        files = {"weights": str(present), "vq_weights": str(present)}
        return [
            MissingWeights({"weights": str(gpt)}, gpt, GPT_KEY),
            MissingWeights({"weights": str(present), "vq_weights": str(vq)}, vq, VQ_KEY),
            MissingWeights({**files, "t5": str(t5)}, t5, T5_KEY),
            MissingWeights({**files, "t5": str(empty_t5)}, empty_t5, T5_KEY, r"config\.json.*model\.adapter\.t5"),
            MissingWeights({"weights": hub}, hub, GPT_KEY, offline_hub),
        ]
