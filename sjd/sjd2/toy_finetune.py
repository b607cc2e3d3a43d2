"""SJD2's fine-tune of the toy model for next-clean-token prediction (docs/algorithms.md §10); its command line is
`scripts/finetune_sjd2.py`, and it makes sjd/assets/toy_sjd2 (the real models' recipe is sjd/sjd2/finetune.py).

Starting from a toy checkpoint, each training sequence gets (with probability 1 - clean_frac) one random segment
of image-stream inputs replaced by noisy embeddings x_t = (1 - t) e_hat + t eps, every token at its own noise
level, and the loss stays the ordinary next-token cross-entropy on the clean sequence. The model sees each input's
level through a learned timestep embedding (sjd/sjd2/toy_net.py). Batches and noise are pure functions of
(seed, step), so the run is reproducible at a fixed thread count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sjd.sjd2.toy_net import N_LEVELS, NoiseAwareLM, save_noise_aware
from sjd.toy.model import TEXT_CONTEXT, load_toy
from sjd.toy.tokenizer import ToyVocab
from sjd.toy.training import HELDOUT_INDEX, image_targets, lr_at, make_batch

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "sjd" / "assets" / "toy"
TOY_SJD2 = ROOT / "sjd" / "assets" / "toy_sjd2"


@dataclass(frozen=True)
class ToyFineTuneSettings:
    """What the shipped sjd/assets/toy_sjd2 was fine-tuned with (its config.json records them)."""

    seed: int = 0
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    warmup: int = 50
    cfg_dropout: float = 0.15
    max_segment: int = 64  # the longest noisy segment (SJD2's window is below it)
    clean_frac: float = 0.2  # sequences left clean, to keep AR quality
    threads: int = 2  # fixed so that runs are bit-reproducible


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
    """Next-token cross-entropy on the clean image stream, from inputs noised at `levels` (noise drawn from `g`;
    none without one)."""
    inputs = batch[:, :-1]
    clean = model.clean_embeddings(inputs)
    noise = torch.randn(clean.shape, generator=g) if g is not None else torch.zeros_like(clean)
    embeds = model.noisy(clean, levels, noise)
    logits = model(embeds, levels).logits
    targets = image_targets(batch)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


@torch.no_grad()
def heldout_losses(
    model: NoiseAwareLM, vocab: ToyVocab, data_seed: int, s: ToyFineTuneSettings
) -> tuple[list[float], list[float]]:
    """The model's loss on four held-out batches, clean and with noisy segments (the model is left in eval mode)."""
    model.eval()
    held = [make_batch(vocab, data_seed, HELDOUT_INDEX + i, 64, 0.0) for i in range(4)]
    clean = [noisy_loss(model, b, torch.zeros(b.shape[0], b.shape[1] - 1, dtype=torch.long), None).item() for b in held]
    noisy = [
        noisy_loss(model, b, *noise_plan(b, s.seed, HELDOUT_INDEX + i, s.max_segment, 0.0)).item()
        for i, b in enumerate(held)
    ]
    return clean, noisy


def finetune_toy(settings: ToyFineTuneSettings, base: Path, out: Path) -> dict:
    """Fine-tune the toy checkpoint at `base` from `settings`, print its progress and held-out losses, write it to
    `out`; returns what its config.json keeps besides the architecture. Sets torch's thread count; the global RNG
    is left as it was."""
    s = settings
    torch.set_num_threads(s.threads)
    vocab = ToyVocab()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s.seed)
        lm, _ = load_toy(base, config_key="--base")
        model = NoiseAwareLM(lm)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.98), weight_decay=0.01)
        print(f"SJD2 fine-tune of {base}: {s.steps} steps of {s.batch_size}")

        # A different data seed from the base training, so the fine-tune sees fresh scenes.
        data_seed = s.seed + 1
        start, running = time.time(), None
        for step in range(s.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, s.steps, s.lr, s.warmup)
            batch = make_batch(vocab, data_seed, step, s.batch_size, s.cfg_dropout)
            levels, g = noise_plan(batch, s.seed, step, s.max_segment, s.clean_frac)
            loss = noisy_loss(model, batch, levels, g)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
            if step % 50 == 0 or step == s.steps - 1:
                print(f"step {step:5d}  loss {running:.4f}  {time.time() - start:7.1f}s", flush=True)

    clean, noisy = heldout_losses(model, vocab, data_seed, s)
    meta = {
        "base": str(base.relative_to(ROOT)) if base.is_relative_to(ROOT) else str(base),
        "train": {
            "seed": s.seed,
            "steps": s.steps,
            "batch_size": s.batch_size,
            "lr": s.lr,
            "warmup": s.warmup,
            "cfg_dropout": s.cfg_dropout,
            "max_segment": s.max_segment,
            "clean_frac": s.clean_frac,
            "threads": s.threads,
            "final_train_loss": round(running, 4),
            "heldout_clean_loss": round(float(np.mean(clean)), 4),
            "heldout_noisy_loss": round(float(np.mean(noisy)), 4),
            "minutes": round((time.time() - start) / 60, 1),
        },
    }
    save_noise_aware(model, out, meta)
    print(f"held-out loss: clean {np.mean(clean):.4f}, noisy segments {np.mean(noisy):.4f}; wrote {out}")
    return meta
