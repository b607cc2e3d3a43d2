"""The toy text-to-image transformer: a small `LlamaForCausalLM` over the toy vocabulary.

It is built from transformers classes so that it goes through the same cache API
(`DynamicCache`, `crop`) as the real-model adapters. Weights are stored as safetensors next
to a JSON file with the architecture and the layout, and are loaded without pickle.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from sjd.toy.tokenizer import ToyVocab

TEXT_CONTEXT = 24  # BOS + caption words + PAD; the image stream starts at this position


def toy_llama_config(
    hidden_size: int = 128, layers: int = 4, heads: int = 4, intermediate_size: int = 384
) -> LlamaConfig:
    vocab = ToyVocab()
    return LlamaConfig(
        vocab_size=vocab.size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=512,
        rope_theta=10000.0,
        pad_token_id=vocab.PAD,
        bos_token_id=vocab.BOS,
        eos_token_id=vocab.eoi,
        tie_word_embeddings=False,
    )


def build_toy_model(config: LlamaConfig) -> LlamaForCausalLM:
    model = LlamaForCausalLM(config)
    model.config.use_cache = True
    return model


def save_toy(model: LlamaForCausalLM, directory: Path, meta: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"))
    payload = {"llama": model.config.to_dict(), "text_context": TEXT_CONTEXT, **meta}
    (directory / "config.json").write_text(json.dumps(payload, indent=2, sort_keys=True))


def load_toy(
    directory: str | Path, config_key: str = "model.adapter.weights", name: str = "toy"
) -> tuple[LlamaForCausalLM, dict]:
    """Load a toy checkpoint directory; a missing file names the model, the path and the config key."""
    directory = Path(directory)
    weights, cfg_file = directory / "model.safetensors", directory / "config.json"
    for f in (weights, cfg_file):
        if not f.is_file():
            raise FileNotFoundError(
                f"model {name!r}: {f} not found. Set `{config_key}` to a directory holding "
                "model.safetensors and config.json (train one with scripts/train_toy.py)."
            )
    meta = json.loads(cfg_file.read_text())
    model = build_toy_model(LlamaConfig(**meta["llama"]))
    model.load_state_dict(load_file(str(weights)))
    return model.eval(), meta
