"""Train the toy text-to-image model from a seed and write its safetensors checkpoint.

    python scripts/train_toy.py                      # reproduces sjd/assets/toy (time: its config.json)
    python scripts/train_toy.py --steps 20 --out /tmp/toy   # a smoke run

Data are generated on the fly from (seed, step) by sjd.toy.scenes, so the run is a pure
function of its arguments: same seed, steps and thread count give the same weights.
Captions are dropped (replaced by the NULL caption) with probability `--cfg-dropout`, which
is what makes classifier-free guidance work at sampling time.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sjd.toy.model import build_toy_model, save_toy, toy_llama_config
from sjd.toy.tokenizer import ToyVocab
from sjd.toy.training import HELDOUT_INDEX, image_targets, lr_at, make_batch

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "sjd" / "assets" / "toy"


def image_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy on the image stream only (the caption is the condition)."""
    logits = model(input_ids=batch[:, :-1]).logits
    targets = image_targets(batch)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--cfg-dropout", type=float, default=0.15)
    ap.add_argument("--threads", type=int, default=2, help="fixed so that runs are bit-reproducible")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    vocab = ToyVocab()
    model = build_toy_model(toy_llama_config())
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"toy model: {n_params / 1e6:.2f} M parameters; {args.steps} steps of {args.batch_size}")

    start, running = time.time(), None
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        loss = image_loss(model, make_batch(vocab, args.seed, step, args.batch_size, args.cfg_dropout))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {running:.4f}  {time.time() - start:7.1f}s", flush=True)

    # Held-out loss on batches the training never drew (indices from 10**9 on).
    model.eval()
    with torch.no_grad():
        held = [image_loss(model, make_batch(vocab, args.seed, HELDOUT_INDEX + i, 64, 0.0)).item() for i in range(4)]
    meta = {
        "train": {
            "seed": args.seed,
            "steps": args.steps,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "warmup": args.warmup,
            "cfg_dropout": args.cfg_dropout,
            "threads": args.threads,
            "final_train_loss": round(running, 4),
            "heldout_loss": round(float(np.mean(held)), 4),
            "minutes": round((time.time() - start) / 60, 1),
        }
    }
    save_toy(model, args.out, meta)
    print(f"held-out image loss {np.mean(held):.4f} nats/token; wrote {args.out}")


if __name__ == "__main__":
    main()
