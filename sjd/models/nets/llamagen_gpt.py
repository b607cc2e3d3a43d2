"""LlamaGen's text-to-image GPT, written for our adapter (FoundationVision/LlamaGen, autoregressive/models/gpt.py).

Parameter names are the release's, so `t2i_XL_stage1_256.pt` / `t2i_XL_stage2_512.pt` load strictly:

    cls_embedding.uncond_embedding      [cls_token_num, caption_dim]  learned null caption (a buffer in the release)
    cls_embedding.cap_proj.fc1/fc2      caption projection: Linear -> GELU(tanh) -> Linear, no bias
    tok_embeddings                      [vocab, dim], the VQ codes themselves are the token ids
    layers.N.attention.wqkv / wo        fused q|k|v (split along dim 0), output projection
    layers.N.feed_forward.w1 / w3 / w2  SwiGLU
    layers.N.attention_norm / ffn_norm  RMSNorm (eps 1e-5)
    norm, output                        final RMSNorm, untied head

The sequence is `cls_token_num` caption slots (projected T5 features, left-padded), then the image codes in raster
order; the code at grid cell g sits at slot cls_token_num + g.

2-D RoPE, as LlamaGen computes it (`precompute_freqs_cis_2d` + `apply_rotary_emb`): adjacent pairs (x[2j], x[2j+1])
are rotated; the first head_dim/4 pairs by the cell's row, the last head_dim/4 by its column, with frequencies
base^(-2k / (head_dim/2)). Caption slots get an all-zero table entry, cos = sin = 0, which does not leave them
unrotated but *zeroes* their queries and keys: every attention score that involves a caption slot is 0, and the
caption reaches the image only through the values. The checkpoints were trained that way, so we keep it.
The table is float32 and rotation runs in float32, as in the release, whatever the model dtype.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# Named sizes of autoregressive/models/gpt.py (GPT_models). The released T2I checkpoints are GPT-XL.
GPT_SIZES: dict[str, dict[str, int]] = {
    "GPT-B": dict(n_layer=12, n_head=12, dim=768),
    "GPT-L": dict(n_layer=24, n_head=16, dim=1024),
    "GPT-XL": dict(n_layer=36, n_head=20, dim=1280),
    "GPT-XXL": dict(n_layer=48, n_head=24, dim=1536),
    "GPT-XXXL": dict(n_layer=48, n_head=40, dim=2560),
    "GPT-1B": dict(n_layer=22, n_head=32, dim=2048),
    "GPT-3B": dict(n_layer=24, n_head=32, dim=3200),
    "GPT-7B": dict(n_layer=32, n_head=32, dim=4096),
}


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


@dataclass(frozen=True)
class LlamaGenConfig:
    """The release's `ModelArgs` fields that shape the T2I model (defaults: LlamaGen-XL T2I at 512 px)."""

    dim: int = 1280
    n_layer: int = 36
    n_head: int = 20
    n_kv_head: int | None = None
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    vocab_size: int = 16384
    caption_dim: int = 2048  # flan-t5-xl hidden size
    cls_token_num: int = 120  # caption slots = T5 max length = rows of uncond_embedding in the release
    grid_size: int = 32  # codes per side: 512 px / 16

    @classmethod
    def build(cls, model: str | Mapping, **overrides) -> LlamaGenConfig:
        """A named size (`GPT-XL`, ...) or a mapping of fields, plus overrides (e.g. grid_size)."""
        if isinstance(model, str):
            if model not in GPT_SIZES:
                raise ValueError(f"model.adapter.gpt_model={model!r} is not one of {sorted(GPT_SIZES)}")
            values = dict(GPT_SIZES[model])
        else:
            values = dict(model)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"model.adapter.gpt_model: unknown LlamaGen GPT fields {unknown}; known: {sorted(known)}")
        return cls(**{**values, **overrides})

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def ffn_dim(self) -> int:
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return find_multiple(hidden, self.multiple_of)

    @property
    def n_image_tokens(self) -> int:
        return self.grid_size**2


def rope_2d_table(grid_size: int, head_dim: int, base: float, cls_token_num: int) -> torch.Tensor:
    """[cls_token_num + grid_size**2, head_dim // 2, 2] (cos, sin) per slot and rotated pair; zeros for captions."""
    quarter = head_dim // 4
    freqs = base ** (-torch.arange(0, 2 * quarter, 2, dtype=torch.float32, device="cpu") / (head_dim // 2))
    angles_1d = torch.arange(grid_size, dtype=torch.float32, device="cpu")[:, None] * freqs  # [grid, quarter]
    rows = angles_1d[:, None, :].expand(grid_size, grid_size, quarter)  # cell (y, x): angle from y ...
    cols = angles_1d[None, :, :].expand(grid_size, grid_size, quarter)  # ... and from x
    angles = torch.cat([rows, cols], dim=-1).flatten(0, 1)  # raster order
    image = torch.stack([angles.cos(), angles.sin()], dim=-1)
    return torch.cat([torch.zeros(cls_token_num, 2 * quarter, 2, device="cpu"), image])


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of x [B, S, H, head_dim] by rope [B, S, head_dim // 2, 2], in float32."""
    pairs = x.float().unflatten(-1, (-1, 2))
    cos, sin = rope[:, :, None, :, 0], rope[:, :, None, :, 1]
    real, imag = pairs[..., 0], pairs[..., 1]
    out = torch.stack([real * cos - imag * sin, imag * cos + real * sin], dim=-1)
    return out.flatten(-2).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # normalised in float32, scaled in the model dtype, as the release does
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class CaptionMLP(nn.Module):
    def __init__(self, in_features: int, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, dim, bias=False)
        self.fc2 = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedding(nn.Module):
    """T5 features -> caption slots; holds the learned unconditional caption used for CFG."""

    def __init__(self, caption_dim: int, dim: int, tokens: int) -> None:
        super().__init__()
        self.cap_proj = CaptionMLP(caption_dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(tokens, caption_dim) / caption_dim**0.5)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.cap_proj(features)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaGenConfig, layer_idx: int) -> None:
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        self.wqkv = nn.Linear(cfg.dim, (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, cache, mask: torch.Tensor) -> torch.Tensor:
        cfg, (B, S, _) = self.cfg, x.shape
        kv = cfg.kv_heads * cfg.head_dim
        q, k, v = self.wqkv(x).split([cfg.dim, kv, kv], dim=-1)
        q = apply_rope(q.view(B, S, cfg.n_head, cfg.head_dim), rope).transpose(1, 2)
        k = apply_rope(k.view(B, S, cfg.kv_heads, cfg.head_dim), rope).transpose(1, 2)
        v = v.view(B, S, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        if cfg.kv_heads != cfg.n_head:
            k = k.repeat_interleave(cfg.n_head // cfg.kv_heads, dim=1)
            v = v.repeat_interleave(cfg.n_head // cfg.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(B, S, cfg.dim))


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaGenConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: LlamaGenConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention = Attention(cfg, layer_idx)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, cache, mask: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope, cache, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class LlamaGenGPT(nn.Module):
    """The T2I transformer. `forward` takes input embeddings (captions from `caption_embeddings` or
    `uncond_caption`, codes from `tok_embeddings`) and returns float32 logits over the codebook.
    Parameters keep torch's default init: real weights always come from a checkpoint (`load_gpt`)."""

    def __init__(self, cfg: LlamaGenConfig) -> None:
        super().__init__()
        if cfg.dim % cfg.n_head or cfg.n_head % cfg.kv_heads or cfg.head_dim % 4:
            raise ValueError(f"LlamaGen GPT: dim {cfg.dim}, {cfg.n_head} heads, {cfg.kv_heads} kv heads do not fit")
        self.config = cfg
        self.cls_embedding = CaptionEmbedding(cfg.caption_dim, cfg.dim, cfg.cls_token_num)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg, i) for i in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        # A plain attribute, not a buffer: not in the release's state dict, and never cast to the model dtype.
        self.rope_table = rope_2d_table(cfg.grid_size, cfg.head_dim, cfg.rope_base, cfg.cls_token_num)

    def caption_embeddings(self, features: torch.Tensor) -> torch.Tensor:
        """[B, cls_token_num, caption_dim] T5 features (pads zeroed) -> caption slot embeddings."""
        return self.cls_embedding(features.to(self.output.weight.dtype))

    def uncond_caption(self, rows: int) -> torch.Tensor:
        """The learned null caption, projected, for `rows` CFG rows."""
        return self.cls_embedding(self.cls_embedding.uncond_embedding.to(self.output.weight.dtype)).expand(rows, -1, -1)

    def rope(self, positions: torch.Tensor) -> torch.Tensor:
        """Table entries of slot positions [B, S]. Positions past the image occur only as window padding, whose
        outputs nobody reads: they reuse the last cell's entry."""
        if self.rope_table.device != positions.device:
            self.rope_table = self.rope_table.to(positions.device)
        return self.rope_table[positions.clamp(0, len(self.rope_table) - 1)]

    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache=None,
        attention_mask: torch.Tensor | None = None,
        prefix_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, S or logits_to_keep, vocab] for `embeds` [B, S, dim]; with `return_hidden`, also the
        hidden states after the final norm [B, S, dim] (what a trained drafter reads).

        `cache`: a transformers `DynamicCache` (or None), appended to, or a static per-row cache's
        (sjd.models.static_cache). `positions` [B, S]: slot positions (caption
        slots 0..cls_token_num-1, image cell g at cls_token_num + g); default: the slots after the cache.
        `attention_mask` [B, 1, S, K] bool (True = attend) over the cached slots plus these; default: causal by slot.
        `prefix_mask` [B, P] hides the first P key slots where False (caption padding, the release's `emb_masks`);
        a query always sees its own slot, so padded caption slots stay finite (the release's diagonal)."""
        B, S, _ = embeds.shape
        past = cache.get_seq_length() if cache is not None else 0
        slots = torch.arange(past, past + S, device=embeds.device).expand(B, S)
        if positions is None:
            positions = slots
        if attention_mask is None:
            keys = torch.arange(past + S, device=embeds.device)
            attention_mask = (keys[None, None, :] <= slots[:, :, None])[:, None]
        static = getattr(cache, "row_cache", None)  # a static per-row cache writes each query at a slot of its own
        if static is not None:
            slots = static.write_slots
        mask = attention_mask.clone()
        if prefix_mask is not None:
            P = prefix_mask.shape[1]
            mask[..., :P] &= prefix_mask[:, None, None, :].to(mask.device)
        rows = torch.arange(B, device=mask.device)[:, None]
        mask[rows, 0, torch.arange(S, device=mask.device)[None, :], slots.to(mask.device)] = True
        rope = self.rope(positions)
        h = embeds
        for layer in self.layers:
            h = layer(h, rope, cache, mask)
        if not return_hidden:
            if logits_to_keep:
                h = h[:, -logits_to_keep:]
            return self.output(self.norm(h)).float()
        hidden = self.norm(h)
        return self.output(hidden[:, -logits_to_keep:] if logits_to_keep else hidden).float(), hidden


# Where LlamaGen's samplers look for the weights inside a checkpoint dict: DDP, DeepSpeed, Lightning-style.
WRAPPER_KEYS = ("model", "module", "state_dict")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a checkpoint file: safetensors, or a torch pickle read with `weights_only=True`, unwrapped
    from the first of WRAPPER_KEYS it has. LlamaGen's training scripts also pickle their argparse namespace
    next to the weights, so that one harmless type is allowed; anything else still refuses to load."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    with torch.serialization.safe_globals([argparse.Namespace]):
        obj = torch.load(path, map_location="cpu", weights_only=True)
    for key in WRAPPER_KEYS:
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path}: expected a state dict, or one under one of the keys {WRAPPER_KEYS}")
    return dict(obj)


def load_gpt(path: str | Path, cfg: LlamaGenConfig) -> LlamaGenGPT:
    """Build the GPT on the meta device and load the checkpoint into it strictly (no random init of 775M
    parameters first). Tensors keep the file's dtype; move the model afterwards."""
    state = read_state_dict(path)
    with torch.device("meta"):
        model = LlamaGenGPT(cfg)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as err:
        raise ValueError(f"{path} does not hold a LlamaGen GPT with {cfg}: {err}") from err
    return model.eval()
