"""The drafter network's layer is the target family's layer (CPU, float32, tiny random configs).

- `chameleon`: transformers' `ChameleonDecoderLayer` with the same weights (per-head q/k norms included),
  1-D RoPE at the config's theta, causal attention: the same outputs.
- `llama`: transformers' `LlamaDecoderLayer` with its input norm replaced by the identity, which is exactly
  EAGLE's layer 0 (no input norm; RMSNorm before the MLP).
- `llamagen`: the same Llama layer under LlamaGen's 2-D rotary table, indexed at the embedded token's slot.
  LlamaGen rotates adjacent pairs (x[2j], x[2j+1]); transformers rotates halves (x[j], x[j + head_dim/2]).
  Reordering each head's query and key rows of the reference layer (even dimensions first, then odd) turns
  one rotation into the other and leaves every attention score unchanged, so the reference computes the
  2-D rotation exactly, with angles we write out by hand here.
- The static cache: pairs written over two calls give the outputs of one call over all pairs.

The whole network is compared each time: fc(cat(embed(t_{i+1}), f_i)) is computed by hand, the embedding first.
"""

import math

import pytest
import torch
from torch import nn

from sjd.drafters.net import FAMILIES, DrafterConfig, DrafterNet, config_from_architecture

pytestmark = pytest.mark.usefixtures("one_thread")

H, HEADS, KV_HEADS, FFN, VOCAB = 64, 4, 2, 96, 50
HEAD_DIM = H // HEADS
GRID, CLS = 4, 5  # llamagen: a 4 x 4 code grid after 5 caption slots
EXACT = dict(atol=2e-6, rtol=0)


def randomize(module: nn.Module, seed: int) -> None:
    """Every parameter random (norm weights near 1, biases near 0), so that no term can vanish unseen."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.3 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(noise * p.shape[-1] ** -0.5)


def inputs(rows: int, width: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (rows, width), generator=g)
    features = torch.randn(rows, width, H, generator=g)
    return tokens, features


def fresh_cache(cfg: DrafterConfig, rows: int, slots: int):
    shape = (rows, cfg.num_key_value_heads, slots, cfg.head_dim)
    return [(torch.zeros(shape), torch.zeros(shape))]


@torch.no_grad()
def ours_causal(net: DrafterNet, tokens, features, positions) -> torch.Tensor:
    """Our forward over one causal run per row: pair w at cache slot w, seeing slots 0 .. w."""
    R, W = tokens.shape
    slots = torch.arange(W).expand(R, W)
    mask = torch.ones(W, W, dtype=torch.bool).tril().expand(R, W, W)
    return net(tokens, features, positions, fresh_cache(net.config, R, W), slots, mask)


@torch.no_grad()
def fc_by_hand(net: DrafterNet, tokens, features) -> torch.Tensor:
    w = net.fc.weight
    return net.embed_tokens.weight[tokens] @ w[:, :H].T + features @ w[:, H:].T + net.fc.bias


def additive_causal(W: int) -> torch.Tensor:
    return torch.full((W, W), float("-inf")).triu(1)[None, None]


@torch.no_grad()
def reference(layer: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions) -> torch.Tensor:
    out = layer(x, attention_mask=additive_causal(x.shape[1]), position_ids=positions, position_embeddings=(cos, sin))
    return out[0] if isinstance(out, tuple) else out


def eager(config):
    config._attn_implementation = "eager"
    return config


# -- chameleon -------------------------------------------------------------------------------------
def test_chameleon_layer_is_transformers_chameleon_decoder_layer():
    from transformers import ChameleonConfig
    from transformers.models.chameleon.modeling_chameleon import ChameleonDecoderLayer, ChameleonRotaryEmbedding

    config = eager(
        ChameleonConfig(
            vocab_size=VOCAB, hidden_size=H, intermediate_size=FFN, num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS, rms_norm_eps=1e-5, rope_theta=500.0, max_position_embeddings=64,
        )
    )  # fmt: skip
    cfg = config_from_architecture({**config.to_dict(), "num_hidden_layers": 1})
    assert (cfg.family, cfg.rope_theta, cfg.input_norm, cfg.qk_norm) == ("chameleon", 500.0, True, True)
    net = DrafterNet(cfg).eval()
    randomize(net, seed=1)
    library = ChameleonDecoderLayer(config, layer_idx=0).eval()
    # The released Anole drafters' layer keys are the library's: the copy is strict.
    library.load_state_dict(net.layers[0].state_dict(), strict=True)
    assert net.layers[0].self_attn.q_norm.weight.shape == (HEADS, HEAD_DIM)

    tokens, features = inputs(2, 7)
    positions = torch.arange(7)[None, :] + torch.tensor([[0], [9]])  # the second row starts at position 9
    cos, sin = ChameleonRotaryEmbedding(config)(features, positions)
    expected = reference(library, fc_by_hand(net, tokens, features), cos, sin, positions)
    torch.testing.assert_close(ours_causal(net, tokens, features, positions), expected, **EXACT)


# -- llama -----------------------------------------------------------------------------------------
def llama_reference(seed: int, theta: float = 10000.0):
    """transformers' LlamaDecoderLayer without its input norm (EAGLE's layer 0), and its config."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = eager(
        LlamaConfig(
            vocab_size=VOCAB, hidden_size=H, intermediate_size=FFN, num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS, rms_norm_eps=1e-6, rope_theta=theta, max_position_embeddings=64,
        )
    )  # fmt: skip
    layer = LlamaDecoderLayer(config, layer_idx=0).eval()
    layer.input_layernorm = nn.Identity()
    randomize(layer, seed)
    return layer, config


def test_llama_layer_is_transformers_llama_decoder_layer_without_its_input_norm():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    library, config = llama_reference(seed=2, theta=1000.0)
    cfg = config_from_architecture({**config.to_dict(), "num_hidden_layers": 1})
    assert (cfg.family, cfg.rope_theta, cfg.rms_norm_eps, cfg.input_norm) == ("llama", 1000.0, 1e-6, False)
    net = DrafterNet(cfg).eval()
    randomize(net, seed=3)
    net.layers[0].load_state_dict(library.state_dict(), strict=True)  # no input_layernorm on either side

    tokens, features = inputs(2, 6, seed=1)
    positions = torch.arange(6)[None, :] + torch.tensor([[0], [4]])
    cos, sin = LlamaRotaryEmbedding(config)(features, positions)
    expected = reference(library, fc_by_hand(net, tokens, features), cos, sin, positions)
    torch.testing.assert_close(ours_causal(net, tokens, features, positions), expected, **EXACT)


# -- llamagen --------------------------------------------------------------------------------------
def llamagen_angles_by_hand(slot: int, theta: float) -> torch.Tensor:
    """[head_dim/2] the angle of each adjacent pair at a LlamaGen slot: pair j < head_dim/4 turns by the cell's
    row, the others by its column, at frequency theta^(-2 (j mod head_dim/4) / (head_dim/2)); None for a
    caption slot or one past the image (cos = sin = 0 there)."""
    cell = slot - CLS
    if not 0 <= cell < GRID * GRID:
        return None
    row, col = divmod(cell, GRID)
    quarter = HEAD_DIM // 4
    return torch.tensor(
        [(row if j < quarter else col) * theta ** (-2 * (j % quarter) / (HEAD_DIM // 2)) for j in range(HEAD_DIM // 2)]
    )


def halves_from_pairs(layer: nn.Module, heads: int, proj: str) -> None:
    """Reorder each head's output rows of `proj`: even dimensions first, then odd."""
    order = torch.cat([torch.arange(0, HEAD_DIM, 2), torch.arange(1, HEAD_DIM, 2)])
    weight = getattr(layer.self_attn, proj).weight
    with torch.no_grad():
        weight.copy_(weight.view(heads, HEAD_DIM, H)[:, order].reshape(heads * HEAD_DIM, H))


def test_llamagen_layer_rotates_each_pair_by_the_target_table_entry_of_its_token_cell():
    """The pair at drafter position i holds t_{i+1}, which sits at the target's slot i + 1: image cell
    g = i + 1 - CLS gets cell g's row and column angles; the caption slots and the slot past the image get
    cos = sin = 0 (LlamaGen's zero entries; LANTERN's padding past its table)."""
    theta = 100.0
    library, _ = llama_reference(seed=4, theta=theta)
    cfg = DrafterConfig("llamagen", H, VOCAB, HEADS, KV_HEADS, FFN, 1e-6, theta, grid_size=GRID, cls_token_num=CLS)
    net = DrafterNet(cfg).eval()
    randomize(net, seed=5)
    net.layers[0].load_state_dict(library.state_dict(), strict=True)
    halves_from_pairs(library, HEADS, "q_proj")
    halves_from_pairs(library, KV_HEADS, "k_proj")

    # Row 0 crosses from the caption into the image; row 1 reaches the last cell and one slot past the image.
    W = 8
    positions = torch.stack(
        [torch.arange(CLS - 3, CLS - 3 + W), torch.arange(CLS + GRID * GRID - W + 1, CLS + GRID**2 + 1)]
    )
    cos, sin = torch.zeros(2, W, HEAD_DIM), torch.zeros(2, W, HEAD_DIM)
    for r in range(2):
        for w in range(W):
            angles = llamagen_angles_by_hand(int(positions[r, w]) + 1, theta)
            if angles is not None:
                cos[r, w], sin[r, w] = angles.cos().repeat(2), angles.sin().repeat(2)
    assert (cos[0, :2] == 0).all() and (cos[1, -1] == 0).all() and (cos[0, 2] != 0).any()

    tokens, features = inputs(2, W, seed=2)
    expected = reference(library, fc_by_hand(net, tokens, features), cos, sin, positions)
    torch.testing.assert_close(ours_causal(net, tokens, features, positions), expected, **EXACT)


def test_llamagen_rope_at_the_pair_of_cell_g_is_the_rotation_of_cell_g():
    """The indexing alone, element by element: the query of the pair at position CLS + g - 1 turns pair j
    by cell g's angle."""
    cfg = DrafterConfig("llamagen", H, VOCAB, HEADS, HEADS, FFN, grid_size=GRID, cls_token_num=CLS)
    net = DrafterNet(cfg)
    x = torch.randn(1, GRID * GRID, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    cells = torch.arange(GRID * GRID)
    out = net.rope((CLS + cells - 1)[None])(x)
    for g in cells.tolist():
        angles = llamagen_angles_by_hand(CLS + g, cfg.rope_theta)
        c, s = angles.cos(), angles.sin()
        even, odd = x[0, g, :, 0::2], x[0, g, :, 1::2]
        torch.testing.assert_close(out[0, g, :, 0::2], even * c - odd * s, atol=1e-6, rtol=0)
        torch.testing.assert_close(out[0, g, :, 1::2], odd * c + even * s, atol=1e-6, rtol=0)


def test_a_llamagen_drafter_needs_the_grid():
    with pytest.raises(ValueError, match="grid_size"):
        DrafterConfig("llamagen", H, VOCAB, HEADS, HEADS, FFN)


# -- the static cache ------------------------------------------------------------------------------
def random_net(family: str, seed: int) -> DrafterNet:
    cfg = DrafterConfig(family, H, VOCAB, HEADS, KV_HEADS, FFN, grid_size=GRID, cls_token_num=CLS)
    net = DrafterNet(cfg).eval()
    randomize(net, seed)
    return net


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_pairs_written_over_two_calls_give_the_outputs_of_one_call(family):
    """Two rows at different positions, cache slot = position as the drafter run keeps it. The second call
    also overwrites slots that a rejected draft filled with other pairs in between: no trace of them is left."""
    net = random_net(family, seed=6)
    tokens, features = inputs(2, 10, seed=3)
    positions = torch.arange(10)[None, :] + torch.tensor([[0], [3]])
    S = 16

    def mask_of(pos):
        return torch.arange(S)[None, None, :] <= pos[..., None]

    whole = net(tokens, features, positions, fresh_cache(net.config, 2, S), positions, mask_of(positions))
    assert torch.isfinite(whole).all() and whole.std() > 0.1

    kv = fresh_cache(net.config, 2, S)
    first = net(tokens[:, :6], features[:, :6], positions[:, :6], kv, positions[:, :6], mask_of(positions[:, :6]))
    stale_tokens, stale_features = inputs(2, 3, seed=4)  # a draft at the next slots, then rejected
    net(stale_tokens, stale_features, positions[:, 6:9], kv, positions[:, 6:9], mask_of(positions[:, 6:9]))
    second = net(tokens[:, 6:], features[:, 6:], positions[:, 6:], kv, positions[:, 6:], mask_of(positions[:, 6:]))
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, atol=1e-6, rtol=0)


def test_released_key_names():
    """The state-dict keys of the released drafters: LlamaGen / EAGLE layer 0 without an input norm, the
    Chameleon layer with it and with per-head q/k norms; fc with its bias."""
    common = {
        "embed_tokens.weight", "fc.weight", "fc.bias", "layers.0.post_attention_layernorm.weight",
        *(f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"),
        *(f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    }  # fmt: skip
    chameleon = {"layers.0.input_layernorm.weight"} | {
        f"layers.0.self_attn.{n}.{t}" for n in ("q_norm", "k_norm") for t in ("weight", "bias")
    }
    for family in ("llama", "llamagen"):
        assert set(random_net(family, 0).state_dict()) == common
    assert set(random_net("chameleon", 0).state_dict()) == common | chameleon
    no_bias = DrafterConfig("llama", H, VOCAB, HEADS, HEADS, FFN, fc_bias=False)
    assert "fc.bias" not in DrafterNet(no_bias).state_dict()
    assert config_from_architecture({"hidden_size": H, "vocab_size": VOCAB, "num_attention_heads": HEADS,
                                     "intermediate_size": FFN, "bias": False}).fc_bias is False  # fmt: skip
    assert math.isclose(config_from_architecture({"hidden_size": H, "vocab_size": VOCAB, "num_attention_heads": HEADS,
                                                  "intermediate_size": FFN}).rope_theta, 10000.0)  # fmt: skip
