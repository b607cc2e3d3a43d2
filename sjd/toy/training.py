"""Training data and schedule shared by the toy training scripts (train_toy, finetune_sjd2).

Batches are a pure function of (seed, step), so every script that uses them is reproducible.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sjd.toy.model import TEXT_CONTEXT
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
