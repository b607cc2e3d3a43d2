"""Train the toy CLIP (sjd/toy/clip.py): the toy model's CLIP score and FID feature network.

    python scripts/train_toy_clip.py                       # reproduces sjd/assets/toy_clip (time: its config.json)
    python scripts/train_toy_clip.py --steps 5 --out /tmp/clip   # a smoke run

Captioned scenes come from sjd.toy.scenes with a data seed of their own (so neither the toy
model's training data nor its held-out scenes are reused), rendered to pixels by the toy
codebook. Loss: symmetric InfoNCE over the batch, as CLIP. Held-out check printed at the end:
how often an image's own caption scores above every other caption of a held-out batch.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sjd.toy.clip import DEFAULT_DIR, ToyCLIP, save_toy_clip, to_pixel_values
from sjd.toy.model import TEXT_CONTEXT
from sjd.toy.scenes import scene_batch
from sjd.toy.tokenizer import ToyVocab, decode_codes
from sjd.toy.training import HELDOUT_INDEX, lr_at

DATA_SEED = 7


def clip_batch(vocab: ToyVocab, index: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    scenes = scene_batch(DATA_SEED, index, size)
    pixels = torch.from_numpy(decode_codes(np.stack([s.codes for s in scenes]))).permute(0, 3, 1, 2)
    ids = torch.tensor([vocab.encode_text(s.caption, TEXT_CONTEXT) for s in scenes], dtype=torch.long)
    return to_pixel_values(pixels), ids


def clip_loss(model: ToyCLIP, pixels: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    img = F.normalize(model.get_image_features(pixels), dim=-1)
    txt = F.normalize(model.get_text_features(ids), dim=-1)
    logits = model.logit_scale.exp().clamp(max=100) * img @ txt.T
    target = torch.arange(len(ids))
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=DEFAULT_DIR)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    vocab = ToyVocab()
    model = ToyCLIP(vocab.size)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    start, running = time.time(), None
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, 100)
        loss = clip_loss(model, *clip_batch(vocab, step, args.batch_size))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {running:.4f}  {time.time() - start:6.1f}s", flush=True)

    model.eval()
    with torch.no_grad():
        pixels, ids = clip_batch(vocab, HELDOUT_INDEX, 256)
        sim = (
            F.normalize(model.get_image_features(pixels), dim=-1) @ F.normalize(model.get_text_features(ids), dim=-1).T
        )
        top1 = (sim.argmax(1) == torch.arange(256)).float().mean().item()
    meta = {"train": {"seed": args.seed, "data_seed": DATA_SEED, "steps": args.steps, "batch_size": args.batch_size,
                      "lr": args.lr, "final_loss": round(running, 4), "heldout_top1_of_256": round(top1, 4),
                      "minutes": round((time.time() - start) / 60, 1)}}  # fmt: skip
    save_toy_clip(model, args.out, meta)
    print(f"held-out image->caption top-1 among 256: {top1:.3f}; wrote {args.out}")


if __name__ == "__main__":
    main()
