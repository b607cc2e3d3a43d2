"""CLIP score through torchmetrics' `CLIPScore`, with the backend chosen by config.

Backends (`eval.clip.backend`):
- `toy`: the toy CLIP (sjd/eval/toy_clip.py), so toy scores mean something;
- `hf`: a transformers CLIP from a local directory or hub id (SJD: openai/clip-vit-base-patch16,
  x100, images at 299). transformers 5.x returns a ModelOutput from `get_*_features`, which
  torchmetrics does not expect, so the model is wrapped to return the projected embeddings.
  LANTERN's protocol (ViT-B/32, raw cosine, images at 256, captions prefixed "A photo
  depicts ") is this backend with `eval=coco_lantern`; an open_clip backend is not built yet.
torchmetrics reports max(100 * cos, 0); `eval.clip.scale` rescales it (0.01 = raw cosine).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torchmetrics.multimodal.clip_score import CLIPScore

from sjd.eval.protocols import preprocess
from sjd.eval.toy_clip import ToyCLIPProcessor, load_toy_clip


class _HFFeatures(torch.nn.Module):
    """A transformers CLIPModel whose get_*_features return tensors, as torchmetrics expects."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model, self.config = model, model.config

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.model.get_image_features(pixel_values=pixel_values)
        return out if isinstance(out, torch.Tensor) else out.pooler_output

    def get_text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        out = self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
        return out if isinstance(out, torch.Tensor) else out.pooler_output


def clip_loader(backend: str, model: str | None = None) -> Callable[[], tuple]:
    """A zero-argument callable returning (model, processor), as CLIPScore accepts."""
    if backend == "toy":
        return lambda: (load_toy_clip(model, config_key="eval.clip.model"), ToyCLIPProcessor())
    if backend == "hf":
        from transformers import CLIPModel, CLIPProcessor

        local = model is not None and Path(model).is_dir()
        return lambda: (
            _HFFeatures(CLIPModel.from_pretrained(model, local_files_only=local).eval()),
            CLIPProcessor.from_pretrained(model, local_files_only=local),
        )
    raise ValueError(f"eval.clip.backend must be 'toy' or 'hf', got {backend!r}")


def clip_score(
    images: np.ndarray,
    captions: Sequence[str],
    backend: str = "toy",
    model: str | None = None,
    protocol: str = "sjd",
    prefix: str = "",
    scale: float = 1.0,
    batch: int = 64,
) -> float:
    """Mean CLIP score of images [N, H, W, 3] uint8 against their captions."""
    if len(images) != len(captions):
        raise ValueError(f"clip_score: {len(images)} images but {len(captions)} captions")
    metric = CLIPScore(model_name_or_path=clip_loader(backend, model))
    for i in range(0, len(images), batch):
        pixels = preprocess(images[i : i + batch], protocol)
        metric.update(list(pixels), [prefix + c for c in captions[i : i + batch]])
    return float(metric.compute()) * scale
