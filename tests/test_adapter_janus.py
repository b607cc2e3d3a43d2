"""The Janus-Pro adapter on a tiny random `JanusForConditionalGeneration` (CPU, fp32).

The tiny model keeps Janus's structure (Llama trunk, generation embeddings + aligner, generation
head, VQ decoder) at 64 px: 8x8 = 64 image codes from a 128-code codebook."""

import pytest
import torch
from transformers import GenerationConfig, JanusConfig, JanusForConditionalGeneration

from sjd.core.sampling import SamplingConfig
from sjd.decoders.ar import ARDecoder
from sjd.decoders.jacobi import JacobiDecoder
from sjd.decoders.pjd import PJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.zipar import ZipARDecoder
from sjd.harness.provenance import make_generators
from sjd.models.janus import JanusAdapter
from sjd.types import Prompt

PAD, BOS, EOS, IMAGE, BOI = 0, 1, 2, 3, 4
SIDE, CODES = 8, 128
PROMPTS = [Prompt("short", "a red cat"), Prompt("long", "a blue dog sits on the mat under a grey sky")]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)


def tiny_config() -> JanusConfig:
    return JanusConfig(
        image_token_id=IMAGE,
        text_config=dict(
            model_type="llama",
            vocab_size=64,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
        ),
        vision_config=dict(
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=8 * SIDE,
            patch_size=8,
            projection_dim=64,
            num_image_tokens=SIDE * SIDE,
            mlp_ratio=2.0,
        ),
        vq_config=dict(  # 3 upsamplings: 8x8 codes -> 64 px; VQ channels are multiples of 32 (GroupNorm)
            embed_dim=8,
            num_embeddings=CODES,
            latent_channels=32,
            base_channels=32,
            channel_multiplier=[1, 2, 2, 2],
            num_res_blocks=1,
            projection_dim=64,
            image_token_embed_dim=64,
            num_hidden_layers=2,
        ),
    )


def tiny_model(seed: int = 0) -> JanusForConditionalGeneration:
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(tiny_config()).eval()
    # Re-draw the generation path at unit scale (embeddings N(0, 1), matrices N(0, 1/fan_in)). With
    # Janus's 0.02-std init the image-code embeddings barely reach the trunk and greedy decoding
    # repeats one code; at unit scale the codes steer the model and SJD has drafts to reject.
    with torch.no_grad():
        parts = model.model
        for module in (
            parts.generation_embeddings,
            parts.generation_aligner,
            parts.generation_head,
            parts.language_model,
        ):
            for name, weight in module.named_parameters():
                if weight.dim() == 2:
                    weight.normal_(0.0, 1.0 if "embed" in name else weight.shape[1] ** -0.5)
    # What transformers' image generation reads for the CFG rows (a config of its own, so that it is saved).
    model.generation_config = GenerationConfig(
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, generation_kwargs={"boi_token_id": BOI}
    )
    return model


def encode(text: str) -> list[int]:
    """A stand-in tokenizer: BOS, one id per word, begin-of-image (what the processor ends with)."""
    return [BOS] + [5 + sum(map(ord, w)) % 59 for w in text.split()] + [BOI]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def janus(one_thread):
    return JanusAdapter.from_model(tiny_model(), encode)


def gens(prompts, seed=0):
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


def fresh(model, prompt_row: list[int], codes: torch.Tensor) -> torch.Tensor:
    """Uncached image logits of one row, straight from the model's parts: prompt through the text
    embeddings, codes through the generation embeddings + aligner, generation head on top.
    Row g predicts generated position g."""
    embeds = [model.get_input_embeddings()(torch.tensor([prompt_row]))]
    if len(codes):
        embeds.append(model.prepare_embeddings_for_image_generation(codes[None]))
    hidden = model.model.language_model(inputs_embeds=torch.cat(embeds, 1)).last_hidden_state
    return model.model.generation_head(hidden)[0, len(prompt_row) - 1 :].float()


def test_layout_is_the_bare_code_grid(janus):
    lay = janus.layout
    assert (lay.n_tokens, lay.height, lay.width, lay.row_stride, lay.first_code) == (SIDE * SIDE, SIDE, SIDE, SIDE, 0)
    assert (lay.forced == -1).all() and lay.free_tokens.all() and lay.vocab_size == CODES


def test_uncond_rows_are_built_as_transformers_builds_them(janus):
    rows = janus.prompt_rows(PROMPTS, with_uncond=True)
    for cond, uncond in zip(rows[:2], rows[2:], strict=True):
        assert uncond == [BOS] + [PAD] * (len(cond) - 2) + [BOI]  # same length, text -> pad
    with pytest.raises(ValueError, match="'bad'.*begin-of-image"):
        JanusAdapter.from_model(janus.model, lambda t: [BOS, 7]).check_prompts([Prompt("bad", "x")])


@torch.no_grad()
def test_ragged_windows_match_uncached_forward_with_cfg_rows(janus):
    """Prompts of different lengths (left-padded), a window, a truncate to different lengths per
    row, a new window, a rewind into the last window: all equal fresh uncached logits."""
    model, rows = janus.model, janus.prompt_rows(PROMPTS, with_uncond=True)
    seq = torch.randint(0, CODES, (2, 40), generator=torch.Generator().manual_seed(0))

    def check(out, b, gen, start, width):
        for branch, row in ((out.cond, rows[b]), (out.uncond, rows[b + 2])):
            ref = fresh(model, row, gen[: start + width])
            torch.testing.assert_close(branch[b], ref[start + 1 : start + width + 1], atol=1e-4, rtol=0)

    first = janus.prefill(PROMPTS, with_uncond=True)
    for b in range(2):
        torch.testing.assert_close(first.cond[b, 0], fresh(model, rows[b], seq[b, :0])[0], atol=1e-4, rtol=0)
        torch.testing.assert_close(first.uncond[b, 0], fresh(model, rows[b + 2], seq[b, :0])[0], atol=1e-4, rtol=0)
    out = janus.forward(seq[:, :12], [0, 0])
    for b in range(2):
        check(out, b, seq[b], 0, 12)
    janus.truncate([5, 9])  # a ragged batch with holes
    window = torch.stack([seq[0, 20:26], seq[1, 30:36]])
    out = janus.forward(window, [5, 9])
    gens_ = [torch.cat([seq[0, :5], window[0]]), torch.cat([seq[1, :9], window[1]])]
    for b, start in ((0, 5), (1, 9)):
        check(out, b, gens_[b], start, 6)
    # Row 0 rewinds into the middle of its last window; row 1 continues.
    nxt = torch.stack([seq[0, 36:40], seq[1, 0:4]])
    out = janus.forward(nxt, [7, 15])
    check(out, 0, torch.cat([gens_[0][:7], nxt[0]]), 7, 4)
    check(out, 1, torch.cat([gens_[1][:15], nxt[1]]), 15, 4)


@torch.no_grad()
def test_custom_mask_window_matches_fresh_computation(janus):
    """`forward_at` (the custom_mask capability) also runs codes through the generation path."""
    model, rows = janus.model, janus.prompt_rows(PROMPTS, with_uncond=True)
    tok = torch.randint(0, CODES, (2, 6), generator=torch.Generator().manual_seed(3))
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, -1, -1]])
    causal = torch.tril(torch.ones(6, 6, dtype=torch.bool)).expand(2, 6, 6)
    janus.prefill(PROMPTS, with_uncond=True)
    out = janus.forward_at(tok, positions, torch.zeros(2, janus.layout.n_tokens, dtype=torch.bool), causal)
    for b, n in ((0, 6), (1, 4)):
        for branch, row in ((out.cond, rows[b]), (out.uncond, rows[b + 2])):
            torch.testing.assert_close(branch[b, :n], fresh(model, row, tok[b, :n])[1 : n + 1], atol=1e-4, rtol=0)


def test_ar_equals_transformers_own_image_generation(janus):
    """Greedy AR (batch of two prompts of different lengths) equals `generate(generation_mode="image")`
    run on each prompt alone, token for token.

    The processing is the same: transformers mixes raw generation-head logits with
    `ClassifierFreeGuidanceLogitsProcessor` as `uncond + s * (cond - uncond)`, like our pipeline,
    and applies its warpers (temperature, top-k, top-p) only after that and only when sampling.
    Greedy, neither side has warpers and our grammar mask allows every code, so both take the
    arg-max of the same guided logits. (transformers uses a static cache and an all-ones 2-D
    mask; we use the ragged dynamic cache with left padding: the equality also shows that.)"""
    ar = ARDecoder().generate(janus, PROMPTS, GREEDY, gens(PROMPTS))
    for b, p in enumerate(PROMPTS):
        ids = torch.tensor([encode(p.text)])
        ref = janus.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            generation_mode="image",
            do_sample=False,
            guidance_scale=GREEDY.cfg_scale,
        )
        assert torch.equal(ar.tokens[b], ref[0].cpu()), p.prompt_id
    assert all(len(set(row.tolist())) > 10 for row in ar.tokens)  # not a degenerate, repetitive image


@pytest.mark.parametrize("decoder", [SJDDecoder(window=8), SJDDecoder(window=16, init="vertical"), JacobiDecoder(8)])
def test_greedy_speculative_decoders_equal_greedy_ar(janus, decoder):
    ar = ARDecoder().generate(janus, PROMPTS, GREEDY, gens(PROMPTS))
    res = decoder.generate(janus, PROMPTS, GREEDY, gens(PROMPTS, seed=7))
    assert torch.equal(ar.tokens, res.tokens)
    assert all(n <= janus.layout.n_tokens for n in res.n_forward)
    assert sum(res.n_forward) < 2 * janus.layout.n_tokens  # some drafts were accepted


@pytest.mark.parametrize(
    "decoder",
    [PJDDecoder(window=4, context=SIDE), PJDDecoder(window=8, context=SIDE, init="vertical")],
    ids=["pjd4-full-context", "pjd8v-full-context"],
)
def test_greedy_pjd_with_full_row_context_equals_greedy_ar(janus, decoder):
    """No end-of-line token: row r is anchored on row r-1's last code, committed when context = the width."""
    ar = ARDecoder().generate(janus, PROMPTS, GREEDY, gens(PROMPTS))
    res = decoder.generate(janus, PROMPTS, GREEDY, gens(PROMPTS, seed=7))
    assert torch.equal(ar.tokens, res.tokens)
    assert [sum(a) for a in res.accepted] == [SIDE * SIDE] * len(PROMPTS)


@pytest.mark.parametrize("decoder", [PJDDecoder(window=4, context=3), ZipARDecoder(context=3)], ids=["pjd", "zipar"])
def test_row_parallel_decoders_with_a_short_context_commit_every_code_once(janus, decoder):
    """Rows start on a draft of the last code above (our no-end-of-line anchoring); a prompt's tokens do not
    depend on its batch."""
    sampled = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)
    res = decoder.generate(janus, PROMPTS, sampled, gens(PROMPTS))
    assert [sum(a) for a in res.accepted] == [SIDE * SIDE] * len(PROMPTS)
    assert ((res.tokens >= 0) & (res.tokens < CODES)).all()
    assert all(n < SIDE * SIDE - SIDE for n in res.n_forward)
    alone = decoder.generate(janus, PROMPTS[:1], sampled, gens(PROMPTS[:1])).tokens
    assert torch.equal(res.tokens[:1], alone)


def test_decode_images_gives_uint8_pixels(janus):
    codes = torch.randint(0, CODES, (3, SIDE * SIDE), generator=torch.Generator().manual_seed(1))
    images = janus.decode_images(codes, chunk=2)
    assert images.shape == (3, 8 * SIDE, 8 * SIDE, 3) and images.dtype.name == "uint8"
    assert images.std() > 0


def tiny_processor():
    """A real `JanusProcessor` over a word-level tokenizer and a minimal chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import JanusImageProcessorPil, JanusProcessor, PreTrainedTokenizerFast

    words = ["<pad>", "<bos>", "<eos>", "<image>", "<boi>", "<eoi>", "<unk>", "<|User|>:", "<|Assistant|>:"]
    words += "a red cat blue dog sits on the mat under grey sky".split()
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        extra_special_tokens={"image_token": "<image>", "boi_token": "<boi>", "eoi_token": "<eoi>"},
    )
    template = (
        "{% for m in messages %}<|User|>: {% for c in m['content'] %}{{ c['text'] }}{% endfor %} {% endfor %}"
        "{% if add_generation_prompt %}<|Assistant|>:{% endif %}"
    )
    return JanusProcessor(JanusImageProcessorPil(), tokenizer, chat_template=template, num_image_tokens=SIDE * SIDE)


def test_a_checkpoint_directory_loads_through_the_real_path(tmp_path, janus):
    """save_pretrained (safetensors) + processor, then the constructor as run.py calls it."""
    janus.model.save_pretrained(tmp_path)
    tiny_processor().save_pretrained(tmp_path)
    loaded = JanusAdapter(weights=str(tmp_path), name="janus", device="cpu", dtype="float32", resolution=8 * SIDE)
    rows = loaded.prompt_rows(PROMPTS[:1], with_uncond=True)
    assert rows[0] == [BOS, 7, 9, 10, 11, 8, BOI]  # "<|User|>: a red cat <|Assistant|>:" + begin-of-image
    assert rows[1] == [BOS, PAD, PAD, PAD, PAD, PAD, BOI]
    with torch.no_grad():
        out = loaded.prefill(PROMPTS[:1], with_uncond=True)
    torch.testing.assert_close(out.cond[0, 0], fresh(janus.model, rows[0], torch.empty(0, dtype=torch.long))[0])
    with pytest.raises(ValueError, match="model.adapter.resolution=384"):
        JanusAdapter(weights=str(tmp_path), device="cpu", resolution=384)
    # Without a generation config of its own, the begin-of-image id comes from the tokenizer.
    (tmp_path / "generation_config.json").unlink()
    bare = JanusAdapter(weights=str(tmp_path), device="cpu", resolution=None)
    assert (bare.bos_id, bare.pad_id, bare.boi_id) == (BOS, PAD, BOI)


def test_missing_weights_directory_names_model_path_and_config_key(tmp_path):
    missing = tmp_path / "Janus-Pro-7B"
    with pytest.raises(FileNotFoundError) as err:
        JanusAdapter(weights=str(missing), name="janus")
    msg = str(err.value)
    assert "'janus'" in msg and str(missing) in msg and "model.adapter.weights" in msg


def test_code_embeddings_are_the_generation_vq_codebook(janus):
    codebook = janus.model.model.vqmodel.quantize.embedding.weight.detach().float()
    assert torch.equal(janus.code_embeddings()[: codebook.shape[0]], codebook)
