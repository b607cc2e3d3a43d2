"""A stand-in Lumina-mGPT: the real architecture and grammar at tiny size, with a character tokenizer.

The checkpoint is an ordinary transformers Chameleon directory (config.json, model.safetensors,
tokenizer.json), so it loads through `LuminaAdapter`'s own loader like the 7B model does. The
vocabulary keeps Chameleon's structure and names (specials, 8192 codes `IMGIMG..Z`, begin- and
end-of-image, Lumina's end-of-turn, end-of-line and size tokens) followed by one id per printable
ASCII character; the real model's 65536-id vocabulary is cut to the ids a prompt can use, which
changes nothing the decoders see (they sample code columns only). Embeddings are tied to the LM
head, which halves the checkpoint.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch

from sjd.models.lumina import END_OF_LINE, size_token

SPECIALS = ["<s>", "<pad>", "</s>", "<image>"]
CODE0 = len(SPECIALS)
CHARACTERS = [c for c in string.printable if c.isprintable() or c == "\n"]  # printable ASCII and newline
STANDIN_KEY = "standin"  # config.json entry with what the stand-in was trained on (sjd.standin.training)


def code_name(i: int) -> str:
    return "IMGIMG" + str(i).translate(str.maketrans("0123456789", "ABCDEFGHIJ")) + "Z"


def vocabulary(n_codes: int, max_grids: int = 32) -> dict[str, int]:
    """Token name -> id: specials, codes, image specials, size tokens, characters."""
    names = [*SPECIALS, *(code_name(i) for i in range(n_codes))]
    names += ["<eoss>", "<racm3:break>", "<reserved08706>", END_OF_LINE]
    names += [size_token(g) for g in range(1, max_grids + 1)]
    names += CHARACTERS
    return {name: i for i, name in enumerate(names)}


def character_tokenizer(vmap: dict[str, int]):
    """A transformers fast tokenizer mapping each character to its id (a BPE with no merges)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {c: vmap[c] for c in CHARACTERS}
    vocab["<unk>"] = vmap["<image>"]  # never produced by a valid caption: check_prompts reports the character
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def standin_config(n_codes: int, hidden: int, layers: int, heads: int, max_positions: int):
    from transformers import ChameleonConfig

    vmap = vocabulary(n_codes)
    return ChameleonConfig(
        vocab_size=len(vmap),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        vocabulary_map=vmap,
        bos_token_id=vmap["<s>"],
        eos_token_id=vmap["</s>"],
        pad_token_id=vmap["<pad>"],
        tie_word_embeddings=True,
        # transformers' Chameleon class always builds its VQ encoder; generation never reads it
        vq_config=dict(embed_dim=4, num_embeddings=n_codes, latent_channels=4, resolution=16, base_channels=32,
                       channel_multiplier=[1, 2], num_res_blocks=1, attn_resolutions=[]),
    )  # fmt: skip


def build_model(n_codes: int, hidden: int, layers: int, heads: int, max_positions: int, seed: int):
    """A randomly initialised tiny Chameleon, the starting point of training."""
    from transformers import ChameleonForConditionalGeneration

    torch.manual_seed(seed)
    return ChameleonForConditionalGeneration(standin_config(n_codes, hidden, layers, heads, max_positions))


def save(model, tokenizer, directory: Path, meta: dict) -> None:
    """config.json (with the training record under `standin`), float16 safetensors and the tokenizer files."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    model.config.update({STANDIN_KEY: meta})
    model.config.save_pretrained(directory)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    state = {k: v for k, v in state.items() if k != "lm_head.weight"}  # tied to the embedding
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    tokenizer.save_pretrained(directory)


def read_meta(directory: Path) -> dict:
    config = json.loads((Path(directory) / "config.json").read_text())
    if STANDIN_KEY not in config:
        raise ValueError(f"{directory}/config.json has no {STANDIN_KEY!r} entry: not a stand-in checkpoint")
    return config[STANDIN_KEY]
