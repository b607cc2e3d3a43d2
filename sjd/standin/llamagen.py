"""A stand-in LlamaGen: our LlamaGen GPT at tiny size over the real layout, with a tiny T5 and VQ.

The layout is LlamaGen-XL's at 512 px: 32 x 32 codes of a 16384-code codebook in raster order, no
special tokens, after the caption slots. The files are what `LlamaGenAdapter` loads for the real
model, so the stand-in goes through the same loader: `gpt.safetensors` (the GPT), `vq.safetensors`
(a tiny VQ of the real kind, 16x downsampling, whose pixels nobody reads: the stand-in paints codes
with their colours) and `t5/` (a tiny randomly initialised T5 encoder, kept fixed, with a word-level
tokenizer over the stand-in captions' words; the GPT's caption projection learns to read it).
"""

from __future__ import annotations

from pathlib import Path

import torch

from sjd.standin.procedural import COLOURS, TEXTURES

WORDS = ["a", "field", "with", "patches", *COLOURS, *TEXTURES]
PAD, EOS, UNK = 0, 1, 2
CAPTION_SLOTS, CAPTION_DIM = 16, 32
VQ_FIELDS = dict(base_channels=32, channel_multiplier=[1, 1, 1, 1, 1], num_res_blocks=1, latent_channels=32,
                 embed_dim=8, num_embeddings=16384)  # fmt: skip


def gpt_fields(hidden: int, layers: int, heads: int) -> dict:
    return dict(dim=hidden, n_layer=layers, n_head=heads, multiple_of=32, vocab_size=16384, caption_dim=CAPTION_DIM,
                cls_token_num=CAPTION_SLOTS)  # fmt: skip


def tokenizer():
    """Word-level T5-style tokenizer: lower-cased words, then `</s>`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "</s>": EOS, "<unk>": UNK, **{w: 3 + i for i, w in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def build_parts(hidden: int, layers: int, heads: int, seed: int):
    """(GPT, tokenizer, T5 encoder, VQ), randomly initialised from `seed`."""
    from transformers import JanusVQVAE, T5Config, T5EncoderModel

    from sjd.models.nets.llamagen_gpt import LlamaGenConfig, LlamaGenGPT
    from sjd.models.nets.llamagen_vq import vq_config

    torch.manual_seed(seed)
    gpt = LlamaGenGPT(LlamaGenConfig.build(gpt_fields(hidden, layers, heads), grid_size=32))
    t5 = T5EncoderModel(T5Config(vocab_size=3 + len(WORDS), d_model=CAPTION_DIM, d_kv=8, d_ff=64, num_layers=1,
                                 num_heads=4, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
                                 dropout_rate=0.0)).eval()  # fmt: skip
    vq = JanusVQVAE(vq_config(VQ_FIELDS, 32)).eval()
    return gpt, tokenizer(), t5, vq


def save(gpt, tok, t5, vq, directory: Path, meta: dict) -> None:
    import json

    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    half = {k: v.detach().to(torch.float16).contiguous() for k, v in gpt.state_dict().items()}
    save_file(half, directory / "gpt.safetensors", metadata={"format": "pt"})
    save_file({k: v.to(torch.float16).contiguous() for k, v in vq.state_dict().items()}, directory / "vq.safetensors")
    t5.save_pretrained(directory / "t5", safe_serialization=True)
    tok.save_pretrained(directory / "t5")
    (directory / "standin.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
