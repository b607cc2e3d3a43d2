"""The EAGLE drafter network: one decoder layer of the target's family over (token, feature) pairs.

For position i the drafter reads f_i, the target's last hidden state after its final norm, and the
embedding of the next token t_{i+1}, and predicts f_{i+1}:

    x_i      = fc(concat(embed(t_{i+1}), f_i))        # Linear(2H -> H), the embedding first
    f^_{i+1} = layer(x)_i                              # one decoder layer, causal over the drafter's own cache
    logits   = target.lm_head(f^_{i+1})                # the target's frozen head (never part of the drafter)

The layer is the target family's, as the released drafters build it (docs/algorithms.md §12.1):
- `llama` (EAGLE's, and LANTERN's for LlamaGen): no input norm before attention, RMSNorm before the MLP;
- `chameleon` (LANTERN's for Anole and Lumina-mGPT): an input RMSNorm too, and the per-head LayerNorm of
  queries and keys that Chameleon applies before its rotary embedding;
- `llamagen`: the `llama` layer under LlamaGen's 2-D rotary table (adjacent pairs rotated, as the target
  does), indexed by the embedded token's slot: the pair (f_i, t_{i+1}) gets the target table's entry i + 1,
  so the pair whose token is image cell g gets cell g's angles. LANTERN's LlamaGen drafter computes the same:
  it builds the table with one caption slot fewer (119 for the target's 120) and indexes it at i. Slots past
  the table rotate by zero, as LANTERN pads its table with zero entries.

The state dict uses the released checkpoints' key names (`embed_tokens.weight`, `fc.weight`, `fc.bias`,
`layers.0.self_attn.q_proj.weight`, ...), so a LANTERN or EAGLE drafter loads into it as it is
(sjd.drafters.checkpoint). Keys and values live in a static cache of the caller's (sjd.drafters.drafter):
`forward` writes this call's keys and values at the slots it is given and attends through the mask it is
given, so the network itself keeps no state.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F

from sjd.models.nets.llamagen_gpt import apply_rope, rope_2d_table

FAMILIES = ("llama", "chameleon", "llamagen")


@dataclass(frozen=True)
class DrafterConfig:
    family: str  # llama | chameleon | llamagen
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    fc_bias: bool = True  # EAGLE's `"bias"` config key; on unless a config says false
    attention_bias: bool = False
    mlp_bias: bool = False
    grid_size: int = 0  # llamagen: codes per side of the 2-D rotary table
    cls_token_num: int = 0  # llamagen: caption slots before the image in the table

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"drafter family must be one of {FAMILIES}, got {self.family!r}")
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"drafter: hidden_size {self.hidden_size}, {self.num_attention_heads} heads and "
                f"{self.num_key_value_heads} key-value heads do not fit"
            )
        if self.family == "llamagen" and self.grid_size < 1:
            raise ValueError(
                f"a llamagen drafter needs the target's grid_size for its 2-D rotary table, got {self.grid_size}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def input_norm(self) -> bool:
        return self.family == "chameleon"

    @property
    def qk_norm(self) -> bool:
        return self.family == "chameleon"

    def to_dict(self) -> dict:
        return asdict(self)


def family_of(architecture: dict) -> str:
    """The drafter layer family of a target (or drafter) config: `chameleon`, `llamagen` (our GPT, or a
    LANTERN LlamaGen drafter config, which names its `input_type`), else `llama`."""
    model_type = str(architecture.get("model_type", "llama"))
    if model_type == "chameleon":
        return "chameleon"
    if model_type == "llamagen" or "input_type" in architecture:
        return "llamagen"
    return "llama"


def config_from_architecture(arch: dict) -> DrafterConfig:
    """A drafter config from a transformers-style config dict: the target's `architecture()`, or a released
    drafter's config.json (the target's config with `num_hidden_layers: 1`)."""
    heads = int(arch["num_attention_heads"])
    return DrafterConfig(
        family=family_of(arch),
        hidden_size=int(arch["hidden_size"]),
        vocab_size=int(arch["vocab_size"]),
        num_attention_heads=heads,
        num_key_value_heads=int(arch.get("num_key_value_heads") or heads),
        intermediate_size=int(arch["intermediate_size"]),
        rms_norm_eps=float(arch.get("rms_norm_eps", 1e-5)),
        rope_theta=float(arch.get("rope_theta") or (arch.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        fc_bias=bool(arch.get("bias", True)),
        attention_bias=bool(arch.get("attention_bias", False)),
        mlp_bias=bool(arch.get("mlp_bias", False)),
        grid_size=int(arch.get("grid_size", 0) or 0),
        cls_token_num=int(arch.get("cls_token_num", 0) or 0),
    )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class HeadNorm(nn.Module):
    """Chameleon's query/key norm: statistics over each head's dimensions, a weight and bias per head."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(heads, head_dim))
        self.bias = nn.Parameter(torch.zeros(heads, head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [R, W, heads, head_dim]
        return F.layer_norm(x, x.shape[-1:], None, None, eps=1e-5) * self.weight + self.bias


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        H, hd, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.cfg = cfg
        self.q_proj = nn.Linear(H, cfg.num_attention_heads * hd, bias=bias)
        self.k_proj = nn.Linear(H, cfg.num_key_value_heads * hd, bias=bias)
        self.v_proj = nn.Linear(H, cfg.num_key_value_heads * hd, bias=bias)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, H, bias=bias)
        if cfg.qk_norm:
            self.q_norm = HeadNorm(cfg.num_attention_heads, hd)
            self.k_norm = HeadNorm(cfg.num_key_value_heads, hd)

    def forward(self, x: torch.Tensor, rope, kv: tuple[torch.Tensor, torch.Tensor], slots, mask) -> torch.Tensor:
        R, W, _ = x.shape
        cfg = self.cfg
        q = self.q_proj(x).view(R, W, cfg.num_attention_heads, cfg.head_dim)
        k = self.k_proj(x).view(R, W, cfg.num_key_value_heads, cfg.head_dim)
        v = self.v_proj(x).view(R, W, cfg.num_key_value_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q), rope(k)
        keys, values = kv  # [R, kv_heads, S, head_dim], this call's slots written in place
        index = slots[:, None, :, None].expand(R, cfg.num_key_value_heads, W, cfg.head_dim)
        keys.scatter_(2, index, k.transpose(1, 2).to(keys.dtype))
        values.scatter_(2, index, v.transpose(1, 2).to(values.dtype))
        groups = cfg.num_attention_heads // cfg.num_key_value_heads
        if groups > 1:
            keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask[:, None])
        return self.o_proj(out.transpose(1, 2).reshape(R, W, -1))


class MLP(nn.Module):
    """The Llama family's SwiGLU, as LlamaGen's FeedForward (sjd/models/nets/llamagen_gpt.py) is: kept apart because
    each module's parameter names are its checkpoints' keys (EAGLE's gate/up/down_proj, LlamaGen's w1/w3/w2)."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        bias = cfg.mlp_bias
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        if cfg.input_norm:
            self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, kv, slots, mask) -> torch.Tensor:
        normed = self.input_layernorm(x) if hasattr(self, "input_layernorm") else x
        h = x + self.self_attn(normed, rope, kv, slots, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DrafterNet(nn.Module):
    """embed_tokens (a frozen copy of the target's), fc, and one layer; see the module docstring."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=cfg.fc_bias)
        self.layers = nn.ModuleList([Layer(cfg)])
        hd = cfg.head_dim
        # Plain attributes, not buffers: they stay float32 whatever dtype the network is cast to.
        self._inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        self._table_2d = None
        if cfg.family == "llamagen":
            table = rope_2d_table(cfg.grid_size, hd, cfg.rope_theta, cfg.cls_token_num)
            self._table_2d = torch.cat([table, torch.zeros_like(table[:1])])  # the last entry: past the table

    def rope(self, positions: torch.Tensor):
        """The rotation of drafter positions [R, W] (the index of f_i): 1-D rotate-half for llama and
        chameleon; LlamaGen's 2-D table at the embedded token's slot i + 1 for llamagen."""
        if self.config.family == "llamagen":
            if self._table_2d.device != positions.device:
                self._table_2d = self._table_2d.to(positions.device)
            past = len(self._table_2d) - 1
            slot = positions + 1
            entry = self._table_2d[torch.where((slot >= 0) & (slot < past), slot, past)]
            return lambda x: apply_rope(x, entry)
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq.to(positions.device)
        angles = positions.clamp(min=0).float()[..., None] * self._inv_freq
        emb = torch.cat([angles, angles], dim=-1)
        cos, sin = emb.cos()[:, :, None, :], emb.sin()[:, :, None, :]
        return lambda x: (x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype)

    def forward(
        self,
        tokens: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        slots: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Predicted features [R, W, H] for pairs (`tokens` [R, W] = t_{i+1}, `features` [R, W, H] = f_i) at
        drafter `positions` [R, W]; keys and values go to cache `slots` [R, W] of `kv` (one (keys, values)
        pair per layer), and query w attends to the cache slots with `mask` [R, W, S] True."""
        dtype = self.fc.weight.dtype
        x = self.fc(torch.cat([self.embed_tokens(tokens), features.to(dtype)], dim=-1))
        rope = self.rope(positions)
        for layer, layer_kv in zip(self.layers, kv):
            x = layer(x, rope, layer_kv, slots, mask)
        return x
