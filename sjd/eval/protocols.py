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
