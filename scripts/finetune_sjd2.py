"""Fine-tune the shipped toy model for SJD2's next-clean-token prediction (docs/algorithms.md §10).

    python scripts/finetune_sjd2.py                        # reproduces sjd/assets/toy_sjd2 (time: its config.json)
    python scripts/finetune_sjd2.py --steps 5 --out /tmp/sjd2   # a smoke run

Starting from sjd/assets/toy, each training sequence gets (with probability 1 - --clean-frac)
one random segment of image-stream inputs replaced by noisy embeddings
x_t = (1 - t) e_hat + t eps, every token at its own noise level, and the loss stays the ordinary
next-token cross-entropy on the clean sequence. The model sees each input's level through a
learned timestep embedding (sjd/sjd2/toy_net.py). Batches and noise are pure functions of
(seed, step), so the run is reproducible at a fixed thread count.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sjd.sjd2.toy_net import N_LEVELS, NoiseAwareLM, save_noise_aware
from sjd.toy.model import TEXT_CONTEXT, load_toy
from sjd.toy.tokenizer import ToyVocab
from sjd.toy.training import HELDOUT_INDEX, image_targets, lr_at, make_batch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASE = ROOT / "sjd" / "assets" / "toy"
DEFAULT_OUT = ROOT / "sjd" / "assets" / "toy_sjd2"


def noise_plan(batch: torch.Tensor, seed: int, step: int, max_segment: int, clean_frac: float):
    """Per input position of batch[:, :-1]: noise level (0 = clean) and the Gaussian noise."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    B, T = batch.shape[0], batch.shape[1] - 1
    levels = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        if torch.rand((), generator=g) < clean_frac:
            continue
        start = int(torch.randint(TEXT_CONTEXT + 1, T, (), generator=g))  # never the prompt or BOI
        length = int(torch.randint(1, max_segment + 1, (), generator=g))
        end = min(T, start + length)
        levels[b, start:end] = torch.randint(1, N_LEVELS, (end - start,), generator=g)
    return levels, g


def noisy_loss(model: NoiseAwareLM, batch: torch.Tensor, levels: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    inputs = batch[:, :-1]
    clean = model.clean_embeddings(inputs)
    noise = torch.randn(clean.shape, generator=g) if g is not None else torch.zeros_like(clean)
    embeds = model.noisy(clean, levels, noise)
    logits = model(embeds, levels).logits
    targets = image_targets(batch)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--cfg-dropout", type=float, default=0.15)
    ap.add_argument("--max-segment", type=int, default=64, help="longest noisy segment (SJD2's window is below it)")
    ap.add_argument("--clean-frac", type=float, default=0.2, help="sequences left clean, to keep AR quality")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--base", type=Path, default=DEFAULT_BASE)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    vocab = ToyVocab()
    lm, _ = load_toy(args.base, config_key="--base")
    model = NoiseAwareLM(lm)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    print(f"SJD2 fine-tune of {args.base}: {args.steps} steps of {args.batch_size}")

    # A different data seed from the base training, so the fine-tune sees fresh scenes.
    data_seed = args.seed + 1
    start, running = time.time(), None
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        batch = make_batch(vocab, data_seed, step, args.batch_size, args.cfg_dropout)
        levels, g = noise_plan(batch, args.seed, step, args.max_segment, args.clean_frac)
        loss = noisy_loss(model, batch, levels, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {running:.4f}  {time.time() - start:7.1f}s", flush=True)

    model.eval()
    with torch.no_grad():
        held = [make_batch(vocab, data_seed, HELDOUT_INDEX + i, 64, 0.0) for i in range(4)]
        clean = [
            noisy_loss(model, b, torch.zeros(b.shape[0], b.shape[1] - 1, dtype=torch.long), None).item() for b in held
        ]
        noisy = [
            noisy_loss(model, b, *noise_plan(b, args.seed, HELDOUT_INDEX + i, args.max_segment, 0.0)).item()
            for i, b in enumerate(held)
        ]
    meta = {
        "base": str(args.base.relative_to(ROOT)) if args.base.is_relative_to(ROOT) else str(args.base),
        "train": {
            "seed": args.seed,
            "steps": args.steps,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "warmup": args.warmup,
            "cfg_dropout": args.cfg_dropout,
            "max_segment": args.max_segment,
            "clean_frac": args.clean_frac,
            "threads": args.threads,
            "final_train_loss": round(running, 4),
            "heldout_clean_loss": round(float(np.mean(clean)), 4),
            "heldout_noisy_loss": round(float(np.mean(noisy)), 4),
            "minutes": round((time.time() - start) / 60, 1),
        },
    }
    save_noise_aware(model, args.out, meta)
    print(f"held-out loss: clean {np.mean(clean):.4f}, noisy segments {np.mean(noisy):.4f}; wrote {args.out}")


if __name__ == "__main__":
    main()
