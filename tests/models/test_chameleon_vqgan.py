"""Our Chameleon VQGAN on a tiny random config (CPU, fp32): key names, the decoder against a
functional forward written from the key names alone, the encoder against transformers'
`ChameleonVQVAE` (same checkpoint layout, independent code), and loading the released file format."""

import pytest
import torch
import torch.nn.functional as F
import yaml

from sjd.models.nets.chameleon_vqgan import ChameleonVQGAN, VQGANConfig, load_vqgan

# 2 levels (2x down-sampling), 1 resnet block, attention at 16 px: the encoder's second level and
# the decoder's lowest one, so both attention paths and a channel-changing shortcut are exercised.
TINY = VQGANConfig(
    n_embed=64,
    embed_dim=4,
    z_channels=8,
    ch=32,
    ch_mult=(1, 2),
    num_res_blocks=1,
    attn_resolutions=(16,),
    resolution=32,
)


pytestmark = pytest.mark.usefixtures("one_thread")


def random_vqgan(seed: int = 0) -> ChameleonVQGAN:
    """Random weights everywhere, norm affines included (their defaults of 1 and 0 would hide bugs)."""
    torch.manual_seed(seed)
    model = ChameleonVQGAN(TINY).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".norm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
    return model


class Recording(dict):
    """A state dict that remembers which keys were read."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)


# -- an independent decoder: plain torch ops, driven by the taming key names ----------------------
def _norm(x, sd, p):
    return F.group_norm(x, 32, sd[f"{p}.weight"], sd[f"{p}.bias"], eps=1e-6)


def _conv(x, sd, p, padding):
    return F.conv2d(x, sd[f"{p}.weight"], sd[f"{p}.bias"], padding=padding)


def _resnet(x, sd, p):
    h = _conv(F.silu(_norm(x, sd, f"{p}.norm1")), sd, f"{p}.conv1", 1)
    h = _conv(F.silu(_norm(h, sd, f"{p}.norm2")), sd, f"{p}.conv2", 1)
    return (_conv(x, sd, f"{p}.nin_shortcut", 0) if f"{p}.nin_shortcut.weight" in sd else x) + h


def _attention(x, sd, p):
    b, c, h, w = x.shape
    y = _norm(x, sd, f"{p}.norm")
    q, k, v = (_conv(y, sd, f"{p}.{n}", 0).reshape(b, c, h * w) for n in "qkv")
    weights = torch.softmax(torch.einsum("bci,bcj->bij", q, k) * c**-0.5, dim=-1)  # query i over keys j
    out = torch.einsum("bij,bcj->bci", weights, v).reshape(b, c, h, w)
    return x + _conv(out, sd, f"{p}.proj_out", 0)


def functional_decode(codes, sd, levels: int, blocks: int):
    x = sd["quantize.embedding.weight"][codes].permute(0, 3, 1, 2)
    x = _conv(_conv(x, sd, "post_quant_conv", 0), sd, "decoder.conv_in", 1)
    x = _resnet(_attention(_resnet(x, sd, "decoder.mid.block_1"), sd, "decoder.mid.attn_1"), sd, "decoder.mid.block_2")
    for level in reversed(range(levels)):
        for b in range(blocks + 1):
            x = _resnet(x, sd, f"decoder.up.{level}.block.{b}")
            if f"decoder.up.{level}.attn.{b}.q.weight" in sd:
                x = _attention(x, sd, f"decoder.up.{level}.attn.{b}")
        if level:
            x = _conv(F.interpolate(x, scale_factor=2.0, mode="nearest"), sd, f"decoder.up.{level}.upsample.conv", 1)
    return _conv(F.silu(_norm(x, sd, "decoder.norm_out")), sd, "decoder.conv_out", 1)


def test_decoder_matches_a_functional_forward_and_reads_every_decoder_weight():
    model = random_vqgan()
    codes = torch.randint(0, TINY.n_embed, (2, 3, 5), generator=torch.Generator().manual_seed(0))
    sd = Recording({k: v.detach() for k, v in model.state_dict().items()})
    ref = functional_decode(codes, sd, levels=len(TINY.ch_mult), blocks=TINY.num_res_blocks)
    out = model.decode_codes(codes)
    assert out.shape == (2, 3, 3 * TINY.factor, 5 * TINY.factor)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert "decoder.up.1.attn.0.q.weight" in sd.read and "decoder.up.0.block.0.nin_shortcut.weight" in sd.read
    decoding = {k for k in sd if not k.startswith(("encoder.", "quant_conv."))}
    assert sd.read == decoding  # no decoder parameter the reference does not know by name


def test_encoder_keys_and_outputs_match_transformers_chameleon_vqvae():
    """transformers' ChameleonVQVAE loads the encoder half of the same checkpoint, by the same names."""
    from transformers import ChameleonVQVAEConfig
    from transformers.models.chameleon.modeling_chameleon import ChameleonVQVAE

    hf = ChameleonVQVAE(
        ChameleonVQVAEConfig(
            embed_dim=TINY.embed_dim,
            num_embeddings=TINY.n_embed,
            latent_channels=TINY.z_channels,
            resolution=TINY.resolution,
            base_channels=TINY.ch,
            channel_multiplier=list(TINY.ch_mult),
            num_res_blocks=TINY.num_res_blocks,
            attn_resolutions=list(TINY.attn_resolutions),
        )
    ).eval()
    model = random_vqgan()
    ours = {k: v for k, v in model.state_dict().items() if not k.startswith("decoder.")}
    assert set(ours) == set(hf.state_dict())
    hf.load_state_dict(ours, strict=True)
    pixels = torch.rand(2, 3, TINY.resolution, TINY.resolution, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        expected = hf.encode(pixels)
        torch.testing.assert_close(model.encoder(pixels), expected.last_hidden_state, atol=1e-5, rtol=1e-5)
    assert torch.equal(model.encode(pixels).flatten(), expected.image_tokens.flatten())


def _write_release(directory, state, loss_keys: bool = True):
    """vqgan.yaml in the taming layout (with its lossconfig) and vqgan.ckpt as a training checkpoint."""
    params = {
        "embed_dim": TINY.embed_dim,
        "n_embed": TINY.n_embed,
        "ddconfig": {
            "double_z": False,
            "z_channels": TINY.z_channels,
            "resolution": TINY.resolution,
            "in_channels": 3,
            "out_ch": 3,
            "ch": TINY.ch,
            "ch_mult": list(TINY.ch_mult),
            "num_res_blocks": TINY.num_res_blocks,
            "attn_resolutions": list(TINY.attn_resolutions),
            "dropout": 0.0,
        },
        "lossconfig": {"target": "taming.modules.losses.vqperceptual.VQLPIPSWithDiscriminator"},
    }
    (directory / "vqgan.yaml").write_text(
        yaml.safe_dump({"model": {"target": "taming.models.vqgan.VQModel", "params": params}})
    )
    state = dict(state)
    if loss_keys:
        state["loss.discriminator.main.0.weight"] = torch.zeros(4, 3, 3, 3)
    torch.save({"state_dict": state, "global_step": 7}, directory / "vqgan.ckpt")


def test_the_released_file_layout_loads_strictly_and_decodes(tmp_path):
    model = random_vqgan(seed=3)
    _write_release(tmp_path, model.state_dict())
    loaded = load_vqgan(tmp_path)
    assert loaded.cfg == TINY
    codes = torch.randint(0, TINY.n_embed, (1, 4, 4), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(loaded.decode_codes(codes), model.decode_codes(codes), atol=0, rtol=0)


def test_a_checkpoint_missing_a_weight_is_refused(tmp_path):
    state = random_vqgan().state_dict()
    del state["decoder.up.1.attn.0.proj_out.bias"]
    _write_release(tmp_path, state)
    with pytest.raises(ValueError, match=r"decoder\.up\.1\.attn\.0\.proj_out\.bias"):
        load_vqgan(tmp_path)


def test_safetensors_is_read_and_pickled_objects_are_refused(tmp_path):
    from safetensors.torch import save_file

    model = random_vqgan(seed=4)
    _write_release(tmp_path, {})
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "vqgan.safetensors")
    codes = torch.zeros(1, 2, 2, dtype=torch.long)
    torch.testing.assert_close(load_vqgan(tmp_path).decode_codes(codes), model.decode_codes(codes), atol=0, rtol=0)

    unsafe = tmp_path / "unsafe"
    unsafe.mkdir()
    _write_release(unsafe, model.state_dict())
    torch.save({"state_dict": model.state_dict(), "hparams": VQGANConfig}, unsafe / "vqgan.ckpt")  # a class object
    with pytest.raises(ValueError, match=r"weights_only=True.*vqgan\.safetensors"):
        load_vqgan(unsafe)


def test_missing_files_name_the_config_key(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model\.adapter\.vqgan") as err:
        load_vqgan(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(err.value)
    (tmp_path / "vqgan.yaml").write_text("model: {}\n")  # a config but no weights
    with pytest.raises(FileNotFoundError, match=r"vqgan\.ckpt"):
        load_vqgan(tmp_path)


def test_bad_codes_are_refused():
    model = random_vqgan()
    with pytest.raises(ValueError, match=r"\[B, h, w\]"):
        model.decode_codes(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="code indices"):
        model.decode_codes(torch.full((1, 2, 2), TINY.n_embed))
