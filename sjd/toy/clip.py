"""A small CLIP trained on the toy data: the toy model's CLIP score and FID feature network.

Image tower: a CNN over the 72x72 toy image (one 6x6 patch per code cell), flattened so that
where things are stays in the features, then a 128-d feature layer. Text tower: the toy
vocabulary, a two-layer transformer, masked mean pooling. Both project to a shared 64-d space,
trained contrastively (InfoNCE) on captioned toy scenes by scripts/train_toy_clip.py.

It exposes the interface torchmetrics' `CLIPScore` calls (`get_image_features`,
`get_text_features`, and a processor), so the toy CLIP score is computed by torchmetrics'
own code, exactly as the real CLIP scores are. FID uses the 128-d image features
(`image_features`): a feature network trained on the toy data, as the issue asks.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from sjd.toy.model import TEXT_CONTEXT
from sjd.toy.scenes import GRID
from sjd.toy.tokenizer import PATCH, ToyVocab

IMAGE_SIZE = GRID * PATCH  # 72
FEATURE_DIM = 128
EMBED_DIM = 64
DEFAULT_DIR = Path(__file__).resolve().parents[1] / "assets" / "toy_clip"


class ToyCLIP(nn.Module):
    def __init__(self, vocab_size: int, width: int = 64) -> None:
        super().__init__()
        self.config = nn.Module()  # torchmetrics only probes config.text_config; ours has none
        self.image_trunk = nn.Sequential(
            nn.Conv2d(3, 32, PATCH, stride=PATCH),  # one step per code cell
            nn.GELU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(64, 64, 3, stride=2, padding=1),
            nn.GELU(),
            nn.Flatten(),
            nn.Linear(64 * (GRID // 2) ** 2, FEATURE_DIM),
            nn.GELU(),
        )
        self.image_proj = nn.Linear(FEATURE_DIM, EMBED_DIM)
        self.token_embed = nn.Embedding(vocab_size, width)
        self.pos_embed = nn.Parameter(torch.zeros(TEXT_CONTEXT, width))
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.text_encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.text_proj = nn.Linear(width, EMBED_DIM)
        self.logit_scale = nn.Parameter(torch.tensor(2.659))  # log(1 / 0.07), as CLIP

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, 72, 72] floats in [0, 1] -> [N, 128] features (FID's feature space)."""
        return self.image_trunk(pixel_values * 2 - 1)

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.image_proj(self.image_features(pixel_values))

    def get_text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        mask = input_ids != ToyVocab.PAD if attention_mask is None else attention_mask.bool()
        x = self.token_embed(input_ids) + self.pos_embed[: input_ids.shape[1]]
        x = self.text_encoder(x, src_key_padding_mask=~mask)
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        return self.text_proj(pooled)


def to_pixel_values(images: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """Images [3, H, W] (uint8 or floats in [0, 1]) at any size -> [N, 3, 72, 72] floats in [0, 1]."""
    out = []
    for img in images:
        img = img.float() / 255.0 if img.dtype == torch.uint8 else img.float()
        if img.shape[-2:] != (IMAGE_SIZE, IMAGE_SIZE):
            img = F.interpolate(img[None], size=(IMAGE_SIZE, IMAGE_SIZE), mode="area")[0]
        out.append(img)
    return torch.stack(out)


class ToyCLIPProcessor:
    """What torchmetrics' CLIPScore calls: images -> pixel_values, captions -> ids and mask."""

    def __init__(self) -> None:
        self.vocab = ToyVocab()

    def __call__(self, text=None, images=None, return_tensors: str = "pt", padding: bool = True) -> dict:
        if images is not None:
            return {"pixel_values": to_pixel_values(images)}
        ids = torch.tensor([self.vocab.encode_text(t, TEXT_CONTEXT) for t in text], dtype=torch.long)
        return {"input_ids": ids, "attention_mask": (ids != self.vocab.PAD).long()}


def save_toy_clip(model: ToyCLIP, directory: Path, meta: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"vocab_size": ToyVocab().size, **meta}, indent=2))


def load_toy_clip(directory: str | Path | None = None, config_key: str = "eval.clip.weights") -> ToyCLIP:
    directory = Path(directory) if directory else DEFAULT_DIR
    weights, cfg_file = directory / "model.safetensors", directory / "config.json"
    for f in (weights, cfg_file):
        if not f.is_file():
            raise FileNotFoundError(
                f"toy CLIP: {f} not found. Set `{config_key}` to a directory holding model.safetensors and "
                "config.json (train one with scripts/train_toy_clip.py)."
            )
    model = ToyCLIP(json.loads(cfg_file.read_text())["vocab_size"])
    model.load_state_dict(load_file(str(weights)))
    return model.eval()
