"""The Janus-Pro adapter on a tiny random `JanusForConditionalGeneration` (CPU, fp32).

The tiny model keeps Janus's structure (Llama trunk, generation embeddings + aligner, generation
head, VQ decoder) at 64 px: 8x8 = 64 image codes from a 128-code codebook. The adapter contract
(tests/adapter_contract.py) runs on it, with AR against transformers' own image generation; here,
Janus's layout, CFG rows and loading path."""

import pytest
import torch
from adapter_contract import (
    AdapterContract,
    DecodersOnAdapterContract,
    LibraryGenerateContract,
    LoadsWeightsContract,
)
from transformers import GenerationConfig, JanusConfig, JanusForConditionalGeneration

from sjd.decoders.jacobi import JacobiDecoder
from sjd.decoders.pjd import PJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.zipar import ZipARDecoder
from sjd.models.janus import JanusAdapter
from sjd.types import Prompt

PAD, BOS, EOS, IMAGE, BOI = 0, 1, 2, 3, 4
SIDE, CODES = 8, 128
PROMPTS = [Prompt("short", "a red cat"), Prompt("long", "a blue dog sits on the mat under a grey sky")]


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


@torch.no_grad()
def fresh(model, prompt_row: list[int], codes: torch.Tensor, positions=None) -> torch.Tensor:
    """Uncached image logits of one row, straight from the model's parts: prompt through the text
    embeddings, codes (at generated `positions`, by default 0, 1, ...) through the generation
    embeddings + aligner, generation head on top. Row g predicts generated position g."""
    T = len(prompt_row)
    embeds = [model.get_input_embeddings()(torch.tensor([prompt_row]))]
    if len(codes):
        embeds.append(model.prepare_embeddings_for_image_generation(codes[None]))
    at = torch.arange(len(codes)) if positions is None else torch.as_tensor(positions)
    pos = torch.cat([torch.arange(T), T + at])[None]
    hidden = model.model.language_model(inputs_embeds=torch.cat(embeds, 1), position_ids=pos).last_hidden_state
    return model.model.generation_head(hidden)[0, T - 1 :].float()


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


class TestJanus(AdapterContract, DecodersOnAdapterContract, LibraryGenerateContract, LoadsWeightsContract):
    """No end-of-line token: with context = the width, row r is anchored on row r-1's committed
    last code and PJD equals AR; with a shorter context rows start on a draft of the last code above
    (our no-end-of-line anchoring) and overlap."""

    prompts = PROMPTS
    atol = 1e-4
    min_distinct_codes = 11  # greedy AR is not a degenerate, repetitive image
    adapter_class, model_name = JanusAdapter, "janus"
    empty_checkpoint_detail = r"config\.json.*model\.adapter\.weights"  # a directory needs its config
    greedy_decoders = {
        "sjd8": SJDDecoder(window=8),
        "sjd16v": SJDDecoder(window=16, init="vertical"),
        "jacobi8": JacobiDecoder(window=8),
        "pjd4-full-context": PJDDecoder(window=4, context=SIDE),
        "pjd8v-full-context": PJDDecoder(window=8, context=SIDE, init="vertical"),
    }
    sampled_decoders = {
        "sjd8": SJDDecoder(window=8),
        "pjd-short-context": PJDDecoder(window=4, context=3),
        "zipar-short-context": ZipARDecoder(context=3),
    }

    @pytest.fixture
    def adapter(self, janus):
        return janus

    def fresh_logits(self, adapter, row, generated, positions=None):
        return fresh(adapter.model, adapter.prompt_rows(self.prompts, with_uncond=True)[row], generated, positions)

    def image_size(self, adapter):
        return 8 * SIDE, 8 * SIDE

    def decode(self, adapter, tokens):
        return adapter.decode_images(tokens, chunk=2)  # 3 images: chunks of 2 and 1

    def codebook(self, adapter):
        return torch.arange(CODES), adapter.model.model.vqmodel.quantize.embedding.weight

    def check_speed(self, name, sampling, result, n_tokens):
        if sampling.greedy and name in ("sjd8", "sjd16v", "jacobi8"):
            assert all(n <= n_tokens for n in result.n_forward)
            assert sum(result.n_forward) < 2 * n_tokens  # some drafts were accepted
        if name.endswith("short-context"):  # rows overlap
            assert all(n < n_tokens - SIDE for n in result.n_forward)

    def library_greedy(self, janus, sampling):
        """`generate(generation_mode="image")` run on each prompt alone (our AR runs both prompts, of
        different lengths, as one batch).

        The processing is the same: transformers mixes raw generation-head logits with
        `ClassifierFreeGuidanceLogitsProcessor` as `uncond + s * (cond - uncond)`, like our pipeline,
        and applies its warpers (temperature, top-k, top-p) only after that and only when sampling.
        Greedy, neither side has warpers and our grammar mask allows every code, so both take the
        arg-max of the same guided logits. (transformers uses a static cache and an all-ones 2-D
        mask; we use the ragged dynamic cache with left padding: the equality also shows that.)"""
        rows = []
        for p in PROMPTS:
            ids = torch.tensor([encode(p.text)])
            rows.append(
                janus.model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    generation_mode="image",
                    do_sample=False,
                    guidance_scale=sampling.cfg_scale,
                )[0].cpu()
            )
        return torch.stack(rows)
