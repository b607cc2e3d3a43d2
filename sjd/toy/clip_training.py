"""Training the toy CLIP (sjd/toy/clip.py), the toy model's CLIP score and FID feature network; its command
line is `scripts/train_toy_clip.py`.

Captioned scenes come from sjd.toy.scenes with a data seed of their own (so neither the toy model's training
data nor its held-out scenes are reused), rendered to pixels by the toy codebook. Loss: symmetric InfoNCE over
the batch, as CLIP. The held-out check at the end: how often an image's own caption scores above every other
caption of a held-out batch. Batches are a pure function of (DATA_SEED, step), so a run is reproducible at a
fixed thread count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sjd.toy.clip import ToyCLIP, save_toy_clip, to_pixel_values
from sjd.toy.model import TEXT_CONTEXT
from sjd.toy.scenes import scene_batch
from sjd.toy.tokenizer import ToyVocab, decode_codes
from sjd.toy.training import HELDOUT_INDEX, lr_at

DATA_SEED = 7
HELDOUT_IMAGES = 256


@dataclass(frozen=True)
class ClipTrainSettings:
    """What the shipped sjd/assets/toy_clip was trained with (its config.json records them)."""

    seed: int = 0
    steps: int = 800
    batch_size: int = 64
    lr: float = 2e-3
    threads: int = 2  # fixed so that runs are bit-reproducible


def clip_batch(vocab: ToyVocab, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel values and caption ids of batch `index` of the CLIP's own scenes."""
    scenes = scene_batch(DATA_SEED, index, size)
    pixels = torch.from_numpy(decode_codes(np.stack([s.codes for s in scenes]))).permute(0, 3, 1, 2)
    ids = torch.tensor([vocab.encode_text(s.caption, TEXT_CONTEXT) for s in scenes], dtype=torch.long)
    return to_pixel_values(pixels), ids


def clip_loss(model: ToyCLIP, pixels: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE: each image against every caption of the batch, and each caption against every image."""
    img = F.normalize(model.get_image_features(pixels), dim=-1)
    txt = F.normalize(model.get_text_features(ids), dim=-1)
    logits = model.logit_scale.exp().clamp(max=100) * img @ txt.T
    target = torch.arange(len(ids))
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def train_toy_clip(settings: ClipTrainSettings, out: Path) -> dict:
    """Train the toy CLIP from `settings`, print its progress and held-out top-1, write it to `out`; returns the
    training record its config.json keeps. Sets torch's thread count; the global RNG is left as it was."""
    torch.set_num_threads(settings.threads)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        vocab = ToyVocab()
        model = ToyCLIP(vocab.size)
        opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.01)
        start, running = time.time(), None
        for step in range(settings.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, settings.steps, settings.lr, 100)
            loss = clip_loss(model, *clip_batch(vocab, step, settings.batch_size))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
            if step % 100 == 0 or step == settings.steps - 1:
                print(f"step {step:5d}  loss {running:.4f}  {time.time() - start:6.1f}s", flush=True)

    model.eval()
    with torch.no_grad():
        pixels, ids = clip_batch(vocab, HELDOUT_INDEX, HELDOUT_IMAGES)
        img = F.normalize(model.get_image_features(pixels), dim=-1)
        sim = img @ F.normalize(model.get_text_features(ids), dim=-1).T
        top1 = (sim.argmax(1) == torch.arange(HELDOUT_IMAGES)).float().mean().item()
    s = settings
    meta = {"train": {"seed": s.seed, "data_seed": DATA_SEED, "steps": s.steps, "batch_size": s.batch_size,
                      "lr": s.lr, "final_loss": round(running, 4), "heldout_top1_of_256": round(top1, 4),
                      "minutes": round((time.time() - start) / 60, 1)}}  # fmt: skip
    save_toy_clip(model, out, meta)
    print(f"held-out image->caption top-1 among 256: {top1:.3f}; wrote {out}")
    return meta
