"""Image-caption pairs -> SJD2 training shards through a model's own VQ encoder (scripts/make_sjd2_shards.py).

Tokenising needs the adapter's prompt rows and layout, not its 7B weights: `tokenizing_adapter`
builds the adapter around a model on the `meta` device (config, vocabulary and tokenizer only),
and the VQ encoder is loaded on its own: Chameleon's VQGAN (sjd/models/nets/chameleon_vqgan.py) for
Lumina-mGPT, and for Emu3 transformers' `Emu3VQVAE` with the `vqmodel.*` tensors of the
checkpoint. Images are resized (shorter side) and centre-cropped to the square resolution the
layout expects, scaled to [-1, 1], and encoded to the code grid the model generates.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sjd.models.base import ModelAdapter
from sjd.sjd2.data import image_stream, prompt_row, write_shard

DEFAULT_RESOLUTION = {"lumina": 768, "emu3": 720}  # pixels: the released models' own


@dataclass(frozen=True)
class VQEncoder:
    encode: Callable[[torch.Tensor], torch.Tensor]  # [B, 3, H, W] in [-1, 1] -> [B, H / factor, W / factor] codes
    factor: int  # pixels per code, each way


def load_pixels(path: Path, size: int) -> torch.Tensor:
    """[3, size, size] float in [-1, 1]: shorter side resized to `size` (bicubic), centre crop."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        scale = size / min(im.size)
        w, h = max(size, round(im.width * scale)), max(size, round(im.height * scale))
        im = im.resize((w, h), Image.BICUBIC)
        left, top = (w - size) // 2, (h - size) // 2
        im = im.crop((left, top, left + size, top + size))
        pixels = torch.from_numpy(np.asarray(im, dtype=np.float32)).permute(2, 0, 1)
    return pixels / 127.5 - 1


def tokenizing_adapter(family: str, base: str, resolution: int) -> ModelAdapter:
    """The plain adapter of `family` for checkpoint `base`, its model on the meta device: prompt
    rows, CFG rows and layout exactly as at decode time, without loading the weights."""
    from transformers import AutoConfig, AutoTokenizer, ChameleonForConditionalGeneration, Emu3ForConditionalGeneration

    local = Path(base).is_dir()
    config = AutoConfig.from_pretrained(base, local_files_only=local)
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=local)
    with torch.device("meta"):
        cls = ChameleonForConditionalGeneration if family == "lumina" else Emu3ForConditionalGeneration
        model = cls(config)
    if family == "lumina":
        from sjd.models.loading import as_encoder
        from sjd.models.lumina import GRID_PX, QUESTION, LuminaAdapter

        adapter = LuminaAdapter.__new__(LuminaAdapter)
        grids = resolution // GRID_PX
        # The tokenizer's BOS, as LuminaAdapter's own loader passes it.
        adapter._init(model, as_encoder(tokenizer), grids, grids, None, torch.device("meta"), family, QUESTION,
                      tokenizer.bos_token_id)  # fmt: skip
        return adapter
    from sjd.models.emu3 import Emu3Adapter

    factor = 2 ** (len(config.vq_config.channel_multiplier) - 1)
    return Emu3Adapter.from_model(model, tokenizer, resolution // factor, resolution // factor, device="meta")


def emu3_encoder(base: str, device: str = "cpu") -> VQEncoder:
    """Emu3's VQ encoder from the `vqmodel.*` tensors of a transformers Emu3 checkpoint (safetensors)."""
    from safetensors import safe_open
    from transformers import AutoConfig, Emu3VQVAE

    from sjd.models.chameleon import _safetensors_files

    config = AutoConfig.from_pretrained(base, local_files_only=Path(base).is_dir())
    vq = Emu3VQVAE(config.vq_config)
    state = {}
    for key, file in _safetensors_files(base, Path(base).is_dir()).items():
        if "vqmodel." in key:  # "vqmodel.x" on disk, "model.vqmodel.x" in some conversions
            with safe_open(file, "pt") as f:
                state[key.split("vqmodel.", 1)[1]] = f.get_tensor(key)
    vq.load_state_dict(state, strict=True)
    vq = vq.eval().to(device)

    @torch.no_grad()
    def encode(pixels: torch.Tensor) -> torch.Tensor:
        sizes = torch.tensor([pixels.shape[-2:]] * len(pixels))
        return torch.stack(vq.encode(pixels.to(device), sizes).image_tokens)

    return VQEncoder(encode, int(vq.vision_spatial_factor))


def chameleon_encoder(vqgan: str, device: str = "cpu") -> VQEncoder:
    from sjd.models.nets.chameleon_vqgan import load_vqgan

    model = load_vqgan(vqgan, device=device)
    return VQEncoder(lambda pixels: model.encode(pixels.to(device)), model.cfg.factor)


def encode_pairs(
    adapter: ModelAdapter, encoder: VQEncoder, pairs: list[tuple[Path, str]], batch: int = 8
) -> list[tuple[list[int], list[int]]]:
    """(prompt row, image stream) for every (image, caption) pair. Images are cropped to the layout's
    code grid times the encoder's factor (Lumina-mGPT: 48 x 16 = 768 px; Emu3: 90 x 8 = 720 px)."""
    layout, code_ids = adapter.layout, adapter.vocab.code_ids
    if layout.height != layout.width:
        raise ValueError(f"square images only; the layout's grid is {layout.height} x {layout.width}")
    size = layout.height * encoder.factor
    examples = []
    for i in range(0, len(pairs), batch):
        part = pairs[i : i + batch]
        codes = encoder.encode(torch.stack([load_pixels(p, size) for p, _ in part])).cpu()
        for (_, caption), grid in zip(part, codes):
            examples.append((prompt_row(adapter, caption), image_stream(layout, code_ids, grid)))
    return examples


def read_pairs(path: Path) -> list[tuple[Path, str]]:
    """(image, caption) of every JSON line {"image": <path, relative to the file's folder or absolute>,
    "caption": <text>}; a missing image is named with its file and line."""
    pairs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        item = json.loads(line)
        image = Path(item["image"])
        image = image if image.is_absolute() else path.parent / image
        if not image.is_file():
            raise FileNotFoundError(f"{path}:{n}: image {image} not found")
        pairs.append((image, str(item["caption"])))
    return pairs


def make_shards(
    family: str,
    base: str,
    pairs_file: Path,
    out: Path,
    vqgan: str | None = None,
    resolution: int | None = None,
    shard_size: int = 1024,
    batch: int = 8,
    device: str = "cpu",
) -> list[Path]:
    """Encode the pairs of `pairs_file` for `family` (checkpoint `base`; Lumina-mGPT also needs the
    Chameleon `vqgan` directory) into `out`/shard-00000.safetensors, ... of `shard_size` sequences each."""
    if family not in DEFAULT_RESOLUTION:
        raise ValueError(f"unknown model family {family!r}; expected one of {sorted(DEFAULT_RESOLUTION)}")
    if family == "lumina" and not vqgan:
        raise ValueError("--model lumina needs --vqgan (Chameleon's image tokenizer directory)")
    adapter = tokenizing_adapter(family, base, resolution or DEFAULT_RESOLUTION[family])
    encoder = chameleon_encoder(vqgan, device) if family == "lumina" else emu3_encoder(base, device)
    pairs = read_pairs(pairs_file)
    written = []
    for k, first in enumerate(range(0, len(pairs), shard_size)):
        examples = encode_pairs(adapter, encoder, pairs[first : first + shard_size], batch)
        path = out / f"shard-{k:05d}.safetensors"
        write_shard(path, examples, family)
        written.append(path)
        print(f"{path}: {len(examples)} sequences of {adapter.layout.n_tokens} image tokens", flush=True)
    return written
