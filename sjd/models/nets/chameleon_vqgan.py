"""Chameleon's image VQGAN (codes -> pixels), shared by Lumina-mGPT and Anole.

transformers' `ChameleonVQVAE` has an encoder and a quantizer but no decoder, so image generation
needs this module. It loads Meta's released `vqgan.ckpt` / `vqgan.yaml` (the files Lumina-mGPT reads
from `ckpts/chameleon/tokenizer/`). The architecture is the taming-transformers VQGAN, and the
parameter names follow that checkpoint's keys so that it loads strictly:

    encoder.{conv_in, down.L.block.B.*, down.L.attn.B.*, down.L.downsample.conv, mid.block_1, mid.attn_1,
             mid.block_2, norm_out, conv_out}
    decoder.{conv_in, mid.*, up.L.block.B.*, up.L.attn.B.*, up.L.upsample.conv, norm_out, conv_out}
    quantize.embedding.weight, quant_conv, post_quant_conv

(a resnet block: norm1, conv1, norm2, conv2 and, when channels change, nin_shortcut; an attention
block: norm, q, k, v, proj_out, all 1x1 convolutions). Level L counts from the highest resolution
in both encoder and decoder; the decoder runs its levels from the last to the first. The released
config is 8192 codes x 256 dims, ch 128, ch_mult [1, 1, 2, 2, 4] (16x down-sampling), 2 resnet blocks
per level, no attention outside the middle block.

Decoding: code indices [B, h, w] -> codebook vectors -> post_quant_conv -> decoder -> [B, 3, 16h, 16w]
in about [-1, 1] (Lumina's and Meta's `pil_from_img_toks`). The encoder exists so the checkpoint
loads strictly and for round trips; generation never calls it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import nn

CONFIG_KEY = "model.adapter.vqgan"
GROUPS = 32  # every GroupNorm of the taming VQGAN has 32 groups, eps 1e-6
TRAINING_ONLY_PREFIX = "loss."  # discriminator / perceptual-loss weights a training checkpoint may carry


@dataclass(frozen=True)
class VQGANConfig:
    """The `model.params` of `vqgan.yaml` (taming names); defaults = Chameleon's released VQGAN."""

    n_embed: int = 8192
    embed_dim: int = 256
    z_channels: int = 256
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = field(default_factory=tuple)
    resolution: int = 512
    in_channels: int = 3
    out_ch: int = 3
    double_z: bool = False

    @property
    def factor(self) -> int:
        """Pixels per code along each side."""
        return 2 ** (len(self.ch_mult) - 1)

    @classmethod
    def from_yaml(cls, path: str | Path) -> VQGANConfig:
        data = yaml.safe_load(Path(path).read_text())
        try:
            params = data["model"]["params"]
            dd = params["ddconfig"]
            return cls(
                n_embed=int(params["n_embed"]),
                embed_dim=int(params["embed_dim"]),
                z_channels=int(dd["z_channels"]),
                ch=int(dd["ch"]),
                ch_mult=tuple(int(m) for m in dd["ch_mult"]),
                num_res_blocks=int(dd["num_res_blocks"]),
                attn_resolutions=tuple(int(r) for r in dd.get("attn_resolutions") or ()),
                resolution=int(dd["resolution"]),
                in_channels=int(dd.get("in_channels", 3)),
                out_ch=int(dd.get("out_ch", 3)),
                double_z=bool(dd.get("double_z", False)),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(
                f"{path}: not a taming VQGAN config (needs model.params.n_embed, embed_dim and ddconfig): {err!r}"
            ) from err


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(GROUPS, channels, eps=1e-6)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.norm1 = _norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = _norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        # A 1x1 projection of the skip path only where the channel count changes.
        self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))  # dropout is 0 in the released config and off at inference
        skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return skip + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all pixels, with 1x1-conv projections and a residual."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = _norm(channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (proj(y).flatten(2).transpose(1, 2) for proj in (self.q, self.k, self.v))  # [b, hw, c]
        out = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]  # scale 1/sqrt(c)
        return x + self.proj_out(out.transpose(1, 2).reshape(b, c, h, w))


class Upsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Downsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # taming pads right/bottom only, then a valid conv


class Level(nn.Module):
    """One resolution level: resnet blocks, optional attention after each, optional resampler."""

    def __init__(self, channels: list[int], attention: bool, resample: nn.Module | None, resample_name: str) -> None:
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(a, b) for a, b in zip(channels[:-1], channels[1:]))
        self.attn = nn.ModuleList(AttnBlock(c) for c in channels[1:]) if attention else nn.ModuleList()
        self.resample_name = resample_name
        if resample is not None:
            setattr(self, resample_name, resample)  # `downsample` / `upsample`, as the checkpoint names it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.block):
            x = block(x)
            if len(self.attn):
                x = self.attn[i](x)
        resample = getattr(self, self.resample_name, None)
        return x if resample is None else resample(x)


class Middle(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels)
        self.attn_1 = AttnBlock(channels)
        self.block_2 = ResnetBlock(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class Encoder(nn.Module):
    def __init__(self, cfg: VQGANConfig) -> None:
        super().__init__()
        widths = [cfg.ch * m for m in cfg.ch_mult]
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, 3, padding=1)
        levels, width, res = [], cfg.ch, cfg.resolution
        for i, out in enumerate(widths):
            last = i == len(widths) - 1
            chans = [width] + [out] * cfg.num_res_blocks
            levels.append(Level(chans, res in cfg.attn_resolutions, None if last else Downsample(out), "downsample"))
            width, res = out, res if last else res // 2
        self.down = nn.ModuleList(levels)
        self.mid = Middle(width)
        self.norm_out = _norm(width)
        self.conv_out = nn.Conv2d(width, 2 * cfg.z_channels if cfg.double_z else cfg.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        for level in self.down:
            x = level(x)
        return self.conv_out(F.silu(self.norm_out(self.mid(x))))


class Decoder(nn.Module):
    def __init__(self, cfg: VQGANConfig) -> None:
        super().__init__()
        widths = [cfg.ch * m for m in cfg.ch_mult]
        width, res = widths[-1], cfg.resolution // cfg.factor
        self.conv_in = nn.Conv2d(cfg.z_channels, width, 3, padding=1)
        self.mid = Middle(width)
        levels: list[Level] = []
        for i in reversed(range(len(widths))):  # built from the lowest resolution up
            chans = [width] + [widths[i]] * (cfg.num_res_blocks + 1)
            up = Upsample(widths[i]) if i != 0 else None
            levels.insert(0, Level(chans, res in cfg.attn_resolutions, up, "upsample"))
            width, res = widths[i], res * 2 if i != 0 else res
        self.up = nn.ModuleList(levels)  # indexed by level, highest resolution first, as in the checkpoint
        self.norm_out = _norm(width)
        self.conv_out = nn.Conv2d(width, cfg.out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            x = level(x)
        return self.conv_out(F.silu(self.norm_out(x)))


class Codebook(nn.Module):
    def __init__(self, n_embed: int, embed_dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(n_embed, embed_dim)


class ChameleonVQGAN(nn.Module):
    def __init__(self, cfg: VQGANConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or VQGANConfig()
        if any(c % GROUPS for c in [cfg.ch * m for m in cfg.ch_mult]):
            raise ValueError(f"VQGAN channels ch * ch_mult must be multiples of {GROUPS} (GroupNorm), got {cfg}")
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.quantize = Codebook(cfg.n_embed, cfg.embed_dim)
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.z_channels, 1)

    @torch.no_grad()
    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """[B, h, w] code indices -> [B, out_ch, h * factor, w * factor] pixels, about [-1, 1]."""
        if codes.dim() != 3:
            raise ValueError(f"decode_codes takes [B, h, w] code indices, got shape {tuple(codes.shape)}")
        if codes.numel() and (codes.min() < 0 or codes.max() >= self.cfg.n_embed):
            raise ValueError(f"code indices must lie in [0, {self.cfg.n_embed}), got {codes.min()}..{codes.max()}")
        weight = self.quantize.embedding.weight
        z = F.embedding(codes.to(weight.device), weight).permute(0, 3, 1, 2)  # [B, embed_dim, h, w]
        return self.decoder(self.post_quant_conv(z))

    @torch.no_grad()
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] pixels in [-1, 1] -> [B, H / factor, W / factor] nearest-code indices."""
        z = self.quant_conv(self.encoder(pixels)).permute(0, 2, 3, 1)  # [B, h, w, embed_dim]
        codebook = self.quantize.embedding.weight
        dist = z.pow(2).sum(-1, keepdim=True) - 2 * z @ codebook.T + codebook.pow(2).sum(-1)
        return dist.argmin(-1)


def _read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """`vqgan.safetensors` if present, else `vqgan.ckpt` through the safe unpickler only."""
    st = directory / "vqgan.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(st)
    ckpt = directory / "vqgan.ckpt"
    try:
        data = torch.load(ckpt, map_location="cpu", weights_only=True)
    except Exception as err:  # an UnpicklingError for anything beyond tensors and plain containers
        lines = str(err).splitlines() or [type(err).__name__]
        reason = next((ln.strip() for ln in lines if "Unsupported global" in ln), lines[0])
        raise ValueError(
            f"{ckpt}: cannot be read with torch.load(weights_only=True) ({reason}). Convert it once, where the file "
            "is trusted, to vqgan.safetensors holding its 'state_dict' in the same directory."
        ) from err
    state = data.get("state_dict", data) if isinstance(data, dict) else None
    if not isinstance(state, dict):
        raise ValueError(f"{ckpt}: expected a state dict (or a dict holding one under 'state_dict')")
    return state


def load_vqgan(directory: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """Meta's Chameleon VQGAN from a directory with `vqgan.yaml` and `vqgan.ckpt` (or `vqgan.safetensors`).

    Loading is strict: every parameter of the module must be in the file and vice versa, except
    the training-only `loss.*` entries a taming checkpoint may carry, which are dropped."""
    path = Path(directory).expanduser()
    files = [path / "vqgan.yaml", path / "vqgan.ckpt"]
    if (
        not path.is_dir()
        or not files[0].is_file()
        or not (files[1].is_file() or (path / "vqgan.safetensors").is_file())
    ):
        raise FileNotFoundError(
            f"Chameleon VQGAN: no vqgan.yaml + vqgan.ckpt (or vqgan.safetensors) in {path}. Set `{CONFIG_KEY}` to "
            "the directory holding Chameleon's image tokenizer files (Lumina-mGPT's ckpts/chameleon/tokenizer)."
        )
    model = ChameleonVQGAN(VQGANConfig.from_yaml(path / "vqgan.yaml"))
    state = {k: v for k, v in _read_state_dict(path).items() if not k.startswith(TRAINING_ONLY_PREFIX)}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"Chameleon VQGAN in {path} does not match its vqgan.yaml: {err}") from err
    return model.eval().to(device=device, dtype=dtype)
