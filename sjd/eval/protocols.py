"""Image pre-processing of the two evaluation families (docs/algorithms.md §1.6), applied to real and
generated images alike before any feature network sees them.

- `sjd` (SJD repo: pytorch-fid for FID, torchmetrics CLIPScore): resize to 299x299, bilinear.
- `clean` (LANTERN repo: clean-fid): centre crop to a square, then resize to 256x256, Lanczos.
Numbers computed under different protocols are not comparable; every results row records its
protocol.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

# torchmetrics syncs a metric's state over the default process group at compute() when one is
# initialised. Our metrics are always computed by one process (rank 0 under torchrun, on the merged
# samples of all ranks): the data is complete locally, and the other ranks are not there to join a
# collective (they have finished). So no metric of ours ever syncs.
LOCAL_METRIC = {"sync_on_compute": False, "dist_sync_on_step": False}

PROTOCOLS = {"sjd": (299, Image.BILINEAR, False), "clean": (256, Image.LANCZOS, True)}


def preprocess(images: np.ndarray, protocol: str) -> torch.Tensor:
    """[N, H, W, 3] uint8 -> [N, 3, S, S] uint8 under `protocol`."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"eval protocol must be one of {sorted(PROTOCOLS)}, got {protocol!r}")
    size, resample, crop = PROTOCOLS[protocol]
    out = []
    for img in images:
        pil = Image.fromarray(img)
        if crop:
            side = min(pil.size)
            left, top = (pil.width - side) // 2, (pil.height - side) // 2
            pil = pil.crop((left, top, left + side, top + side))
        out.append(np.asarray(pil.resize((size, size), resample)))
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).contiguous()
