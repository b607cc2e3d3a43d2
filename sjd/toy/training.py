"""The toy model's training (`train_toy`, whose command line is `scripts/train_toy.py`), and the data and schedule
that its SJD2 fine-tune (sjd/sjd2/toy_finetune.py) and the toy CLIP's training (sjd/toy/clip_training.py) share.

Data are generated on the fly from (seed, step) by sjd.toy.scenes, so a run is a pure function of its settings:
the same seed, steps and thread count give the same weights. Captions are dropped (replaced by the NULL caption)
with probability `cfg_dropout`, which is what makes classifier-free guidance work at sampling time.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sjd.toy.model import TEXT_CONTEXT, build_toy_model, save_toy, toy_llama_config
from sjd.toy.scenes import scene_batch
from sjd.toy.tokenizer import ToyVocab

HELDOUT_INDEX = 10**9  # batch indices reserved for held-out data (training never reaches them)


def make_batch(vocab: ToyVocab, seed: int, step: int, batch_size: int, dropout: float) -> torch.Tensor:
    """[batch, TEXT_CONTEXT + image tokens] ids; captions dropped to NULL with prob `dropout`."""
    scenes = scene_batch(seed, step, batch_size)
    drop = np.random.Generator(np.random.PCG64([seed, step, 1])).random(batch_size) < dropout
    rows = []
    for scene, dropped in zip(scenes, drop):
        text = vocab.null_text(TEXT_CONTEXT) if dropped else vocab.encode_text(scene.caption, TEXT_CONTEXT)
        rows.append(text + vocab.image_sequence(scene.codes))
    return torch.tensor(rows, dtype=torch.long)


def image_targets(batch: torch.Tensor) -> torch.Tensor:
    """Next-token targets for batch[:, :-1], with the positions predicting caption tokens ignored."""
    targets = batch[:, 1:].clone()
    targets[:, : TEXT_CONTEXT - 1] = -100
    return targets


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass(frozen=True)
class ToyTrainSettings:
    """What the shipped sjd/assets/toy was trained with (its config.json records them)."""

    seed: int = 0
    steps: int = 2400
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 200
    cfg_dropout: float = 0.15
    threads: int = 2  # fixed so that runs are bit-reproducible


def image_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy on the image stream only (the caption is the condition)."""
    logits = model(input_ids=batch[:, :-1]).logits
    targets = image_targets(batch)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def train_toy(settings: ToyTrainSettings, out: Path) -> dict:
    """Train the toy model from `settings`, print its progress and held-out loss, write it to `out`; returns what
    its config.json keeps besides the architecture. Sets torch's thread count; the global RNG is left as it was."""
    s = settings
    torch.set_num_threads(s.threads)
    vocab = ToyVocab()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s.seed)
        model = build_toy_model(toy_llama_config())
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.98), weight_decay=0.01)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"toy model: {n_params / 1e6:.2f} M parameters; {s.steps} steps of {s.batch_size}")

        start, running = time.time(), None
        for step in range(s.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, s.steps, s.lr, s.warmup)
            loss = image_loss(model, make_batch(vocab, s.seed, step, s.batch_size, s.cfg_dropout))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
            if step % 100 == 0 or step == s.steps - 1:
                print(f"step {step:5d}  loss {running:.4f}  {time.time() - start:7.1f}s", flush=True)

    # Held-out loss on batches the training never drew (indices from HELDOUT_INDEX on).
    model.eval()
    with torch.no_grad():
        held = [image_loss(model, make_batch(vocab, s.seed, HELDOUT_INDEX + i, 64, 0.0)).item() for i in range(4)]
    meta = {
        "train": {
            **asdict(s),
            "final_train_loss": round(running, 4),
            "heldout_loss": round(float(np.mean(held)), 4),
            "minutes": round((time.time() - start) / 60, 1),
        }
    }
    save_toy(model, out, meta)
    print(f"held-out image loss {np.mean(held):.4f} nats/token; wrote {out}")
    return meta
