"""FID through torchmetrics with a pluggable feature network, and cached reference statistics.

Feature networks (`eval.fid.extractor`):
- `toy`: the toy CLIP's 128-d image features (sjd/eval/toy_clip.py), trained on toy data;
- `inception`: torchmetrics' Inception-v3 (the torch-fidelity port of pytorch-fid's network,
  2048-d pool features). It needs `torch-fidelity` and the weights file torch-fidelity uses
  (`pt_inception-2015-12-05-6726825d.pth`) at `eval.fid.inception_weights`, or in its cache
  when the machine was once online. Nothing is downloaded by us.

Reference statistics (sum of features, sum of outer products, count) are computed once from
real images and stored as .npz next to a JSON note of what they were computed from; a run
loads them into the metric instead of re-encoding the real images.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torchmetrics.image.fid import FrechetInceptionDistance

from sjd.eval.protocols import preprocess
from sjd.eval.toy_clip import load_toy_clip, to_pixel_values


class ToyFeatures(nn.Module):
    num_features = 128

    def __init__(self, weights: str | None = None) -> None:
        super().__init__()
        self.clip = load_toy_clip(weights, config_key="eval.fid.weights")

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.clip.image_features(to_pixel_values(images))


def build_metric(extractor: str, weights: str | None = None, inception_weights: str | None = None):
    if extractor == "toy":
        return FrechetInceptionDistance(feature=ToyFeatures(weights), reset_real_features=False)
    if extractor == "inception":
        if not inception_weights or not Path(inception_weights).is_file():
            raise FileNotFoundError(
                f"FID extractor 'inception': weights file {inception_weights!r} not found. Set "
                "`eval.fid.inception_weights` to pt_inception-2015-12-05-6726825d.pth (torch-fidelity's file)."
            )
        try:
            return FrechetInceptionDistance(
                feature=2048, feature_extractor_weights_path=inception_weights, reset_real_features=False
            )
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(f"FID extractor 'inception' needs torch-fidelity: {e}") from e
    raise ValueError(f"eval.fid.extractor must be 'toy' or 'inception', got {extractor!r}")


def add_images(metric: FrechetInceptionDistance, images: np.ndarray, protocol: str, real: bool, batch: int = 64):
    for i in range(0, len(images), batch):
        metric.update(preprocess(images[i : i + batch], protocol), real=real)


def save_reference(metric: FrechetInceptionDistance, path: Path, note: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        path,
        sum=metric.real_features_sum.numpy(),
        cov_sum=metric.real_features_cov_sum.numpy(),
        n=np.array(int(metric.real_features_num_samples)),
    )
    path.with_suffix(".json").write_text(json.dumps(note, indent=2, sort_keys=True))


def load_reference(metric: FrechetInceptionDistance, path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(
            f"FID reference statistics {path} not found; compute them with scripts/fid_reference.py and set "
            "`eval.fid.reference`"
        )
    data = np.load(path, allow_pickle=False)
    if data["sum"].shape[0] != metric.real_features_sum.shape[0]:
        raise ValueError(f"FID reference {path} has {data['sum'].shape[0]}-d features; the extractor gives "
                         f"{metric.real_features_sum.shape[0]}-d (computed with another extractor?)")  # fmt: skip
    metric.real_features_sum = torch.from_numpy(data["sum"]).double()
    metric.real_features_cov_sum = torch.from_numpy(data["cov_sum"]).double()
    metric.real_features_num_samples = torch.tensor(int(data["n"]))


def toy_reference_images(n: int, seed: int = 0) -> np.ndarray:
    """Held-out real toy images: scenes from batch indices the toy model never trained on."""
    from sjd.toy.scenes import scene_batch
    from sjd.toy.tokenizer import decode_codes
    from sjd.toy.training import HELDOUT_INDEX

    scenes = [s for i in range((n + 63) // 64) for s in scene_batch(seed, HELDOUT_INDEX + 1000 + i, 64)][:n]
    return decode_codes(np.stack([s.codes for s in scenes]))


def reference_key(extractor: str, protocol: str, source: str) -> str:
    return hashlib.sha256(f"{extractor}|{protocol}|{source}".encode()).hexdigest()[:16]
