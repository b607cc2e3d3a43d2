"""SJD2's fine-tuning objective (docs/algorithms.md §10) on a real model's noise-aware adapter.

Each training sequence is a prompt row and an image stream (sjd/sjd2/data.py). With probability
`cfg_dropout` the prompt is replaced by the adapter's unconditional row, so the model also learns
the context CFG decodes with. With probability 1 - `clean_frac` one random segment of the stream's
inputs is noised: every image-code input in it gets its own level in 1..L-1 and enters as
x_t = (1 - t) e_hat + t * scale * eps through the adapter's NoisePath. The prompt and the forced
tokens (begin-of-image, size tokens, end-of-line, ...) always enter clean, as SJD2's decoder feeds
them. The loss is the ordinary next-token cross-entropy on the clean sequence, over the
predictions of the stream's tokens (never of the prompt). The model call is the adapter's own
(`_run_embeds` on the NoisePath's inputs), so training and decoding read the model the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

IGNORE = -100


@dataclass
class Batch:
    inputs: torch.Tensor  # [B, T] long: model inputs (padding replaced by a valid id)
    targets: torch.Tensor  # [B, T] long: next tokens, IGNORE on prompt predictions and padding
    image_start: torch.Tensor  # [B] long: input index of generated position 0
    valid: torch.Tensor  # [B, T] bool: real inputs (not padding)


def make_batch(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    indices: Sequence[int],
    uncond: Sequence[int],
    cfg_dropout: float,
    g: torch.Generator,
) -> Batch:
    """Right-padded batch of examples[i] for i in `indices`; right padding keeps every real token's
    position, and causal attention keeps the padding from reaching it."""
    rows, starts = [], []
    for i in indices:
        prompt, stream = examples[i]
        if torch.rand((), generator=g) < cfg_dropout:
            prompt = uncond
        rows.append([*prompt, *stream])
        starts.append(len(prompt))
    T = max(len(r) for r in rows) - 1
    inputs = torch.zeros(len(rows), T, dtype=torch.long)
    targets = torch.full((len(rows), T), IGNORE, dtype=torch.long)
    valid = torch.zeros(len(rows), T, dtype=torch.bool)
    for b, (row, start) in enumerate(zip(rows, starts)):
        seq = torch.tensor(row, dtype=torch.long)
        n = len(row) - 1
        inputs[b, :n], valid[b, :n] = seq[:-1], True
        targets[b, start - 1 : n] = seq[start:]  # input start - 1 (the prompt's last token) predicts position 0
    return Batch(inputs, targets, torch.tensor(starts), valid)


def noise_plan(
    batch: Batch,
    is_code: torch.Tensor,
    n_levels: int,
    max_segment: int,
    clean_frac: float,
    g: torch.Generator,
) -> torch.Tensor:
    """[B, T] long noise levels (0 = clean): one random segment of image-code inputs per noised row.
    `is_code` [vocab] bool marks the image-code ids (the layout's free tokens)."""
    B, T = batch.inputs.shape
    levels = torch.zeros(B, T, dtype=torch.long)
    codes = is_code[batch.inputs] & batch.valid
    for b in range(B):
        if torch.rand((), generator=g) < clean_frac:
            continue
        lo, hi = int(batch.image_start[b]), int(batch.valid[b].sum())
        if hi <= lo:
            continue
        start = int(torch.randint(lo, hi, (), generator=g))
        end = min(hi, start + int(torch.randint(1, max_segment + 1, (), generator=g)))
        drawn = torch.randint(1, n_levels, (end - start,), generator=g)
        levels[b, start:end] = drawn * codes[b, start:end]
    return levels


def noisy_loss(adapter, batch: Batch, levels: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    """Next-clean-token cross-entropy with the planned inputs noised (`noise` [B, T, D] standard
    normal; None = every input clean, whatever `levels` say)."""
    device = adapter.device
    inputs, levels = batch.inputs.to(device), levels.to(device)
    path = adapter.noise_path
    clean = adapter._clean(inputs)
    embeds = clean if noise is None else path.noisy(clean, levels, noise.to(device))
    levels = levels if noise is not None else torch.zeros_like(levels)
    logits = adapter._run_embeds(path.inputs(embeds, levels), use_cache=False).logits
    return F.cross_entropy(logits.float().flatten(0, 1), batch.targets.to(device).flatten(), ignore_index=IGNORE)
