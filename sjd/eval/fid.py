"""FID through torchmetrics with a pluggable feature network, and cached reference statistics.

Feature networks (`eval.fid.extractor`):
- `toy`: the toy CLIP's 128-d image features (sjd/toy/clip.py), trained on toy data;
- `inception`: torchmetrics' Inception-v3 (torch-fidelity's port of the TensorFlow FID network
  that pytorch-fid also uses; 2048-d pool features). It needs `torch-fidelity` (the `eval` extra)
  and the weights file at `eval.fid.inception_weights`: torch-fidelity's
  `weights-inception-2015-12-05-6726825d.pth` (or the same state dict as .safetensors). Nothing is
  downloaded. torch-fidelity unpickles the file with `weights_only=False`, so it never sees the
  user's file: the weights are read here with safetensors or `torch.load(weights_only=True)`
  (which refuses anything but tensors) and handed over as a fresh copy.
  The file must be the reference one, byte for byte (its sha256 is checked), because an FID
  computed with other Inception weights does not compare with published FIDs. Other weights,
  a .safetensors conversion included, need `eval.fid.require_reference_inception=false`.

Reference statistics (sum of features, sum of outer products, count) are computed once from
real images and stored as .npz next to a JSON note of what they were computed from; a run
loads them into the metric instead of re-encoding the real images.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torchmetrics.image.fid import FrechetInceptionDistance

from sjd.eval.protocols import LOCAL_METRIC, preprocess
from sjd.toy.clip import load_toy_clip, to_pixel_values


class ToyFeatures(nn.Module):
    num_features = 128

    def __init__(self, weights: str | None = None) -> None:
        super().__init__()
        self.clip = load_toy_clip(weights, config_key="eval.fid.weights")

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.clip.image_features(to_pixel_values(images))


def load_tensor_file(path: str, config_key: str) -> dict[str, torch.Tensor]:
    """A state dict from .safetensors or a torch pickle of tensors only (`weights_only=True`)."""
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"{config_key}: {path} holds more than tensors; refusing to unpickle it ({e})") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{config_key}: {path} is not a state dict (a mapping of names to tensors)")
    return state


# sha256 of torch-fidelity's weights-inception-2015-12-05-6726825d.pth (95,628,359 bytes), the
# TensorFlow FID graph of 2015-12-05 ported to PyTorch, which torchmetrics and torch-fidelity
# fetch; several independent evaluation pipelines pin this same digest.
REFERENCE_INCEPTION_SHA256 = "6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2"


def check_reference_inception(path: str) -> None:
    """Refuse Inception weights that are not the reference file, naming the key and the fix."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != REFERENCE_INCEPTION_SHA256:
        raise ValueError(
            f"eval.fid.inception_weights: {path} is not the reference FID Inception file "
            f"(sha256 {digest.hexdigest()[:16]}..., expected {REFERENCE_INCEPTION_SHA256[:16]}... of torch-fidelity's "
            "weights-inception-2015-12-05-6726825d.pth), so its FID would not compare with published ones. Use "
            "that file, or set eval.fid.require_reference_inception=false to score with these weights anyway."
        )


def inception_metric(inception_weights: str | None, require_reference: bool = True) -> FrechetInceptionDistance:
    """torchmetrics' 2048-d Inception FID with weights read safely from a local file."""
    if not inception_weights or not Path(inception_weights).is_file():
        raise FileNotFoundError(
            f"FID extractor 'inception': weights file {inception_weights!r} not found. Set "
            "`eval.fid.inception_weights` to torch-fidelity's weights-inception-2015-12-05-6726825d.pth."
        )
    if require_reference:
        check_reference_inception(inception_weights)
    state = load_tensor_file(inception_weights, "eval.fid.inception_weights")
    with tempfile.TemporaryDirectory() as tmp:
        checked = Path(tmp) / "inception.pth"
        torch.save(state, checked)
        try:
            return FrechetInceptionDistance(
                feature=2048, feature_extractor_weights_path=str(checked), reset_real_features=False, **LOCAL_METRIC
            )
        except ModuleNotFoundError as e:
            raise ModuleNotFoundError(
                f"FID extractor 'inception' needs torch-fidelity (the eval extra: pip install -e '.[eval]'): {e}"
            ) from e


def build_metric(
    extractor: str,
    weights: str | None = None,
    inception_weights: str | None = None,
    require_reference_inception: bool = True,
):
    if extractor == "toy":
        return FrechetInceptionDistance(feature=ToyFeatures(weights), reset_real_features=False, **LOCAL_METRIC)
    if extractor == "inception":
        return inception_metric(inception_weights, require_reference_inception)
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
