"""LlamaGen's VQ-16 image tokenizer, decoded through transformers' `JanusVQVAE`.

The two are the same network (taming-style encoder/decoder, 16384 x 8 L2-normalised codebook, z 256, ch 128,
ch_mult [1, 1, 2, 2, 4], 2 res blocks, GroupNorm 32): decoding the same codes gives identical pixels.
Only the module names differ, so the released `vq_ds16_t2i.pt` loads after a key rename:

    LlamaGen                                     Janus
    {encoder,decoder}.conv_blocks.i.res.j        encoder.down.i.block.j / decoder.up.i.block.j
    {encoder,decoder}.conv_blocks.i.attn.j       encoder.down.i.attn.j  / decoder.up.i.attn.j
    encoder.conv_blocks.i.downsample             encoder.down.i.downsample
    decoder.conv_blocks.i.upsample               decoder.up.i.upsample
    {encoder,decoder}.mid.0 / mid.1 / mid.2      mid.block_1 / mid.attn_1 / mid.block_2
    quantize.codebook_used                       (dropped: a training statistic)

Both decoders keep their blocks in processing order (lowest resolution first), so index i maps to index i.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import JanusVQVAE, JanusVQVAEConfig

from sjd.models.nets.llamagen_gpt import read_state_dict

# autoregressive VQ_models of tokenizer/tokenizer_image/vq_model.py; VQ-16 is the T2I tokenizer.
VQ_SIZES: dict[str, dict] = {
    "VQ-16": dict(channel_multiplier=[1, 1, 2, 2, 4]),
    "VQ-8": dict(channel_multiplier=[1, 2, 2, 4]),
}
# LlamaGen's VQ ModelArgs defaults, in Janus's names.
VQ_DEFAULTS = dict(embed_dim=8, num_embeddings=16384, latent_channels=256, base_channels=128, num_res_blocks=2)

_BLOCK = re.compile(r"^(encoder|decoder)\.conv_blocks\.(\d+)\.(res|attn|upsample|downsample)\b")
_MID = {"0": "block_1", "1": "attn_1", "2": "block_2"}
_DROPPED = ("quantize.codebook_used",)


def vq_config(model: str | Mapping, grid_size: int) -> JanusVQVAEConfig:
    """A named VQ (`VQ-16`) or a mapping of JanusVQVAEConfig fields, decoding `grid_size` x `grid_size` codes."""
    if isinstance(model, str):
        if model not in VQ_SIZES:
            raise ValueError(f"model.adapter.vq_model={model!r} is not one of {sorted(VQ_SIZES)}")
        values = {**VQ_DEFAULTS, **VQ_SIZES[model]}
    else:
        values = {**VQ_DEFAULTS, **dict(model)}
    values["channel_multiplier"] = [int(m) for m in values["channel_multiplier"]]  # a list, even from a YAML node
    return JanusVQVAEConfig(**values, num_patches=grid_size)


def downsample_factor(config: JanusVQVAEConfig) -> int:
    return 2 ** (len(config.channel_multiplier) - 1)


def rename_vq_key(key: str) -> str:
    """One LlamaGen VQ state-dict key in Janus's names (see the module docstring)."""
    m = _BLOCK.match(key)
    if m:
        part, level, kind = m.groups()
        stage = "down" if part == "encoder" else "up"
        kind = {"res": "block"}.get(kind, kind)
        return f"{part}.{stage}.{level}.{kind}{key[m.end() :]}"
    mid = re.match(r"^(encoder|decoder)\.mid\.(\d)\.", key)
    if mid:
        return f"{mid.group(1)}.mid.{_MID[mid.group(2)]}.{key[mid.end() :]}"
    return key


def rename_vq_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {rename_vq_key(k): v for k, v in state.items() if k not in _DROPPED}


def load_vq(path: str | Path, config: JanusVQVAEConfig) -> JanusVQVAE:
    """The released VQ checkpoint (weights under "model"), renamed and loaded strictly."""
    state = rename_vq_state_dict(read_state_dict(path))
    model = JanusVQVAE(config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{path} does not hold a LlamaGen VQ tokenizer of this shape ({config}): {err}") from err
    return model.eval()
