"""Every real architecture at its real size with random weights, built through our adapters.

Each builder makes the real configuration (Lumina-mGPT 7B and Anole 7B = Chameleon-7B, Emu3-Gen 8B, Janus-Pro 7B,
LlamaGen-XL 775M) directly on the device in the run dtype with transformers' (or our GPT's) random init, so
nothing is downloaded and building takes seconds. The prompt encoders are offline character tokenizers, the
vocabulary maps carry the real token counts, and the layouts follow `resolution` (the model config's
`adapter.resolution`, which the caller reads). `tiny=True` keeps the vocabularies and layouts and shrinks the widths
and depths; `layers` keeps the real widths and cuts the depth (a shadow's or a check's shorter compile).

The GPU check (sjd.bench.gpu_check), the real-size bench (sjd.bench.real_models) and the shadow forwards
(sjd.harness.shadow) build through these.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch

from sjd.models.base import ModelAdapter
from sjd.types import Prompt

MODELS = ("lumina", "anole", "emu3", "janus", "llamagen")
PROMPT = Prompt("smoke", "a red fox sitting in fresh snow at dawn, soft light, highly detailed")
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


@dataclasses.dataclass
class Built:
    adapter: ModelAdapter
    params: int  # parameters of the modules the timed forwards run through
    note: str = ""


# -- building ------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def building(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Create parameters straight on `device` in `dtype` (what from_pretrained does with a dtype): no float32
    copy of a 7B model, no host-to-device transfer."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def char_encoder(first_id: int) -> Callable[[str], list[int]]:
    """An offline stand-in tokenizer: one id per character (prompt lengths in characters, not BPE pieces)."""
    return lambda text: [first_id + ord(c) % 256 for c in text]


def counted(model: torch.nn.Module, skip: tuple[str, ...]) -> int:
    """Parameters outside the `skip` prefixes (image encoders / decoders that generation never runs)."""
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith(skip))


def chameleon_vocab_map() -> dict[str, int]:
    """Chameleon's ids for what the adapters read: codes IMGIMG..Z at 4..8195, <eoss> 8196, <racm3:break> 8197,
    <reservedNNNNN> at NNNNN + 4 (end-of-turn 8710, Lumina's end-of-line 8803, size tokens from 8804)."""
    digits = str.maketrans("0123456789", "ABCDEFGHIJ")
    vmap = {"<s>": 0, "<pad>": 1, "</s>": 2, "<image>": 3}
    vmap |= {f"IMGIMG{str(i).translate(digits)}Z": 4 + i for i in range(8192)}
    vmap |= {"<eoss>": 8196, "<racm3:break>": 8197}
    vmap |= {f"<reserved{n:05d}>": n + 4 for n in (8706, 8799, *range(8801, 8865))}
    return vmap


def build_chameleon(
    kind: str, tiny: bool, device: torch.device, dtype: torch.dtype, resolution: int, layers: int | None = None
) -> Built:
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from sjd.models.anole import AnoleAdapter
    from sjd.models.lumina import LuminaAdapter

    sizes = dict(TINY, num_key_value_heads=4) if tiny else {}  # Chameleon-7B: ChameleonConfig's defaults
    sizes |= {"num_hidden_layers": layers} if layers else {}
    vq = dict(embed_dim=8, latent_channels=8, base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1)
    config = ChameleonConfig(
        vocab_size=65536, vocabulary_map=chameleon_vocab_map(), bos_token_id=0, pad_token_id=1, eos_token_id=2,
        vq_config=dict(vq, attn_resolutions=[]) if tiny else None, **sizes,
    )  # fmt: skip
    with building(device, dtype):
        model = ChameleonForConditionalGeneration(config).eval()
    encode = char_encoder(20000)
    if kind == "lumina":
        grids = resolution // 32
        adapter = LuminaAdapter.from_model(model, encode, grids, grids, device=str(device))
    else:
        side = resolution // 16
        adapter = AnoleAdapter.from_model(model, encode, side, side, device=str(device))
    return Built(adapter, counted(model, ("model.vqmodel.",)))


def build_emu3(
    tiny: bool, device: torch.device, dtype: torch.dtype, resolution: int, layers: int | None = None
) -> Built:
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    from sjd.models.emu3 import Emu3Adapter

    # Emu3's ids: Qwen's <|extra_k|> from 151646, BOS/EOS 151849/151850, visual tokens 151854.. (32768 codes).
    vmap = {"<|endoftext|>": 151643, "<|extra_200|>": 151846, "<|extra_201|>": 151847, "<|image start|>": 151851,
            "<|image end|>": 151852, "<|image token|>": 151853, "<image>": 151848}  # fmt: skip
    vmap |= {f"<|visual token {i:06d}|>": 151854 + i for i in range(32768)}
    vq = dict(codebook_size=32768, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 2],
              num_res_blocks=1, attn_resolutions=[], hidden_size=64, num_attention_heads=1)  # fmt: skip
    text = dict(TINY) if tiny else {}
    text |= {"num_hidden_layers": layers} if layers else {}
    config = Emu3Config(vocabulary_map=vmap, text_config=text or None, vq_config=vq if tiny else None)
    with building(device, dtype):
        model = Emu3ForConditionalGeneration(config).eval()
    side = resolution // 8  # 720 px / 8 = 90 codes
    adapter = Emu3Adapter.from_model(model, char_encoder(1000), side, side, device=str(device))
    return Built(adapter, counted(model, ("model.vqmodel.",)))


def build_janus(
    tiny: bool, device: torch.device, dtype: torch.dtype, resolution: int = 384, layers: int | None = None
) -> Built:
    """Janus-Pro generates 384 px images only (24 x 24 codes): `resolution` must be 384."""
    if resolution != 384:
        raise ValueError(f"Janus-Pro generates 384 px images, got resolution={resolution}")
    from transformers import GenerationConfig, JanusConfig, JanusForConditionalGeneration

    from sjd.models.janus import JanusAdapter

    bos, eos, pad, boi = 100000, 100001, 100015, 100016  # DeepSeek's tokenizer
    text = dict(model_type="llama", vocab_size=102400, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    if tiny:
        text |= TINY
        vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=192, patch_size=8,
                      projection_dim=64, mlp_ratio=2.0)  # fmt: skip
        vq = dict(embed_dim=8, latent_channels=32, base_channels=32, channel_multiplier=[1, 2, 2, 2],
                  num_res_blocks=1, projection_dim=64, image_token_embed_dim=64)  # fmt: skip
    else:  # Janus-Pro-7B: a 30-layer Llama-7B trunk; SigLIP-L vision encoder; VQ-16 at 384 px
        text |= dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=30, num_attention_heads=32,
                     num_key_value_heads=32, max_position_embeddings=16384)  # fmt: skip
        vision = dict(projection_dim=4096)
        vq = dict(projection_dim=4096, image_token_embed_dim=4096)
    text |= {"num_hidden_layers": layers} if layers else {}
    config = JanusConfig(
        text_config=text, vision_config=dict(vision, num_image_tokens=576), vq_config=dict(vq, num_patches=24)
    )
    with building(device, dtype):
        model = JanusForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, generation_kwargs={"boi_token_id": boi}
    )
    chat = char_encoder(1000)

    def encode(caption: str) -> list[int]:  # DeepSeek's chat template, then begin-of-image
        return [bos, *chat(f"<|User|>: {caption}\n\n<|Assistant|>:"), boi]

    adapter = JanusAdapter.from_model(model, encode, device=device)
    # Generation runs the text embeddings (prompt), the trunk and the generation embeddings / aligner / head.
    skip = ("model.vision_model.", "model.aligner.", "model.vqmodel.", "lm_head.")
    return Built(adapter, counted(model, skip))


def build_llamagen(
    tiny: bool, device: torch.device, dtype: torch.dtype, resolution: int, layers: int | None = None
) -> Built:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import JanusVQVAE, PreTrainedTokenizerFast, T5Config, T5EncoderModel

    from sjd.models.llamagen import LlamaGenAdapter
    from sjd.models.nets.llamagen_gpt import LlamaGenConfig, LlamaGenGPT
    from sjd.models.nets.llamagen_vq import vq_config

    grid = resolution // 16
    depth = {"n_layer": layers} if layers else {}
    if tiny:
        gpt_cfg = LlamaGenConfig.build(
            dict(dim=64, n_layer=2, n_head=4, multiple_of=32, caption_dim=32), grid_size=grid, **depth
        )
        vq_cfg = vq_config(
            dict(base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1, latent_channels=32), grid
        )
    else:
        gpt_cfg = LlamaGenConfig.build("GPT-XL", grid_size=grid, **depth)
        vq_cfg = vq_config("VQ-16", grid)
    words = sorted(set(PROMPT.text.lower().split()))
    backend = Tokenizer(models.WordLevel({"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: 3 + i for i, w in enumerate(words)}},
                                         unk_token="<unk>"))  # fmt: skip
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    # A one-layer random T5 of flan-t5-xl's width stands in for the 1.2B encoder: only the GPT is timed.
    t5 = T5Config(vocab_size=64, d_model=gpt_cfg.caption_dim, d_kv=64, d_ff=256, num_layers=1, num_heads=4,
                  pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, dropout_rate=0.0)  # fmt: skip
    with building(device, dtype):
        gpt = LlamaGenGPT(gpt_cfg).eval()
        encoder = T5EncoderModel(t5).eval()
        vq = JanusVQVAE(vq_cfg).eval()
    adapter = LlamaGenAdapter.from_parts(gpt, tokenizer, encoder, vq, device=device)
    return Built(adapter, counted(gpt, ()), note="T5 encoder: tiny random stand-in (only the GPT is timed)")


# name -> builder(tiny, device, dtype, resolution, layers=None)
BUILDERS: dict[str, Callable[..., Built]] = {
    "lumina": lambda *a: build_chameleon("lumina", *a),
    "anole": lambda *a: build_chameleon("anole", *a),
    "emu3": build_emu3,
    "janus": build_janus,
    "llamagen": build_llamagen,
}
