"""The draft heads' recipe: self-distilled on the drafter recipe's data (the target's own samples and features).

For a row's feature f_j (which predicts id_{j+1}) head k, of offset d, learns the target's feature d positions on,
f_{j+d}: SmoothL1 to it, plus `reject_weight` times the chance that a draft of q fails the target's test there,
1 - sum_x min(p, q), with p and q the CFG mixes of the target's own head on the true and on the predicted features
of the image's rows over the image codes (what the shared pipeline makes of both at a code's position, the sampling
filters aside). Two
losses tried first did worse than the untrained heads on held-out toy images: a cross-entropy on each row's raw
distribution (guidance amplifies the unconditional row's error), and one on the CFG mixes (it pulls q to the mean
of the distributions a feature cannot tell apart, which on a sharp model overlaps each of them less). Each step
takes `batch_size` images, all their rows, and `positions` generated positions of each, drawn with seeded
generators, so a rerun gives the same weights bit for bit on the same machine.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from sjd.core.sampling import SamplingConfig, logits_to_probs
from sjd.drafters.data import DrafterData, Row
from sjd.drafters.heads import DraftHeads
from sjd.drafters.training import RecipeSettings
from sjd.models.base import ModelAdapter
from sjd.types import Logits


@dataclass(frozen=True)
class HeadsTrainSettings(RecipeSettings):
    epochs: int = 10
    lr: float = 1e-3
    batch_size: int = 4  # rows per step
    positions: int = 256  # generated positions per image and step
    cfg_scale: float = 1.0  # the CFG scale the loss mixes rows at (the recipe takes the model's)
    reject_weight: float = 1.0  # weight of the rejection chance beside the feature regression
    weight_decay: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [f"train.{k}={getattr(self, k)!r} (must be > 0)" for k in ("epochs", "lr", "batch_size", "positions")
               if not getattr(self, k) > 0]  # fmt: skip
        bad += [f"train.{k}={getattr(self, k)!r} (must be >= 0)" for k in ("reject_weight", "weight_decay")
                if not getattr(self, k) >= 0]  # fmt: skip
        if bad:
            raise ValueError("bad training settings: " + "; ".join(bad))


def seed_of(settings: HeadsTrainSettings, step: int, what: int) -> int:
    digest = hashlib.sha256(f"heads:{settings.seed}:{step}:{what}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def step_images(data: DrafterData, step: int, settings: HeadsTrainSettings) -> list[list[Row]]:
    """The images of `step`, in the epoch's seeded order: each with all its rows (conditional, then unconditional)."""
    per_epoch = math.ceil(len(data) / settings.batch_size)
    epoch, within = divmod(step, per_epoch)
    order = np.random.default_rng(seed_of(settings, epoch, 0)).permutation(len(data))
    return [data.images[i] for i in order[within * settings.batch_size : (within + 1) * settings.batch_size]]


def row_pairs(row: Row, offsets: tuple[int, ...], picks: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs f_j [M, H] over the row's generated positions (j from the last prompt slot; `picks` chooses some) and
    their targets f_{j+d} [M, K, H]; a target past the row is the last feature, masked by `row_mask`."""
    f = row.features.float()
    first, last = row.prompt_len - 1, len(f) - 1
    j = torch.arange(first, last + 1) if picks is None else first + picks
    ahead = (j[:, None] + torch.as_tensor(offsets)[None, :]).clamp(max=last)
    return f[j], f[ahead]


def row_tokens(row: Row, picks: torch.Tensor | None) -> torch.Tensor:
    """The token each input f_j predicts, id_{j+1} [M]: what token-aware heads read beside f_j (row_pairs' j)."""
    first, last = row.prompt_len - 1, len(row.features) - 1
    j = torch.arange(first, last + 1) if picks is None else first + picks
    return row.ids[j + 1]


def embedded(heads: DraftHeads, embed: torch.Tensor | None, rows: list[Row], picks) -> torch.Tensor | None:
    """[copies, M, H] embeddings of the tokens the rows' inputs predict, for token-aware heads (None else)."""
    if not heads.config.tokens:
        return None
    if embed is None:
        raise ValueError("token-aware heads train on the target's token embeddings; none were given")
    return torch.stack([embed[row_tokens(row, picks).to(embed.device)] for row in rows]).to(heads.up.dtype)


def row_mask(row: Row, offsets: tuple[int, ...], picks: torch.Tensor | None) -> torch.Tensor:
    first, last = row.prompt_len - 1, len(row.features) - 1
    j = torch.arange(first, last + 1) if picks is None else first + picks
    return (j[:, None] + torch.as_tensor(offsets)[None, :]) <= last


def guided(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """[copies, M, V] raw logits of an image's rows -> [M, V] its CFG mix (one row: the row's own)."""
    return logits[0] if logits.shape[0] == 1 else logits[1] + scale * (logits[0] - logits[1])


def heads_loss(
    heads: DraftHeads, head: Callable[[torch.Tensor], torch.Tensor], images: list[list[Row]], step: int,
    settings: HeadsTrainSettings, codes: slice | torch.Tensor = slice(None), embed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:  # fmt: skip
    """SmoothL1 to every row's future features, plus reject_weight x the rejection chance 1 - sum_x min(p, q), with
    p and q the CFG mixes (at `cfg_scale`) of the target's head on the true and on the predicted features: what the
    pipeline makes of both at decode time, over the image codes `codes` (the grammar's free ids: the pipeline gives
    every other id nothing at a code's position), the sampling filters aside. An image's rows share their
    positions. `embed`: the target's token embeddings [V, H], which token-aware heads read."""
    gen = torch.Generator().manual_seed(seed_of(settings, step, 2))
    device = heads.up.device
    regression, rejection, agree, n_rows, n_positions = 0.0, 0.0, 0.0, 0, 0
    for rows in images:
        n = len(rows[0].features) - rows[0].prompt_len + 1
        picks = torch.randperm(n, generator=gen)[: settings.positions]
        pairs = [row_pairs(row, heads.offsets, picks) for row in rows]
        x = torch.stack([p[0] for p in pairs]).to(device)  # [copies, M, H]
        y = torch.stack([p[1] for p in pairs]).to(device)  # [copies, M, K, H]
        mask = row_mask(rows[0], heads.offsets, picks).to(device)  # [M, K]
        predicted = heads(x, embedded(heads, embed, rows, picks))  # [copies, M, K, H]
        keep = mask.float()
        per_row = F.smooth_l1_loss(predicted, y, reduction="none").mean(-1)  # [copies, M, K]
        regression = regression + (per_row * keep).sum() / keep.sum() * len(rows)
        n_rows += len(rows)
        flat = mask.flatten()
        shape = (len(rows), int(flat.sum()), -1)
        student = guided(head(predicted.flatten(1, 2)[:, flat].flatten(0, 1))[:, codes].reshape(shape),
                         settings.cfg_scale)  # fmt: skip
        with torch.no_grad():
            teacher = guided(head(y.flatten(1, 2)[:, flat].flatten(0, 1))[:, codes].reshape(shape),
                             settings.cfg_scale).softmax(-1)  # fmt: skip
        # 1 - sum_x min(p, q): the chance a draft of q fails the target's test (cross-entropy would pull q to the
        # mean of the distributions a feature cannot tell apart, which on a sharp model overlaps each one less)
        rejection = rejection + (1 - torch.minimum(teacher, student.softmax(-1)).sum(-1)).sum()
        agree = agree + (student.argmax(-1) == teacher.argmax(-1)).float().sum()
        n_positions += int(flat.sum())
    regression = regression / n_rows
    rejection = rejection / n_positions
    loss = regression + settings.reject_weight * rejection
    return loss, {"loss": loss.item(), "regression": regression.item(), "rejection": rejection.item(),
                  "top1": float(agree) / n_positions}  # fmt: skip


def train_heads(
    heads: DraftHeads,
    head: Callable[[torch.Tensor], torch.Tensor],
    data: DrafterData,
    settings: HeadsTrainSettings,
    on_step: Callable[[int, dict], None] = lambda step, log: None,
    codes: slice | torch.Tensor = slice(None),
    embed: torch.Tensor | None = None,
) -> list[dict]:
    """AdamW at a cosine-decayed lr over `epochs` passes; returns one log entry per epoch. `embed`: the target's
    token embeddings [V, H], for token-aware heads."""
    per_epoch = math.ceil(len(data) / settings.batch_size)
    total = per_epoch * settings.epochs
    opt = torch.optim.AdamW(heads.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    history, t0, epoch_logs = [], time.perf_counter(), []
    for step in range(total):
        for group in opt.param_groups:
            group["lr"] = settings.lr * 0.5 * (1 + math.cos(math.pi * step / total))
        loss, log = heads_loss(heads, head, step_images(data, step, settings), step, settings, codes, embed)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        epoch_logs.append(log)
        on_step(step + 1, log)
        if (step + 1) % per_epoch == 0:
            mean = {k: float(np.mean([e[k] for e in epoch_logs])) for k in epoch_logs[0]}
            history.append({"step": step + 1, "seconds": round(time.perf_counter() - t0, 1), **mean})
            epoch_logs = []
    return history


@torch.no_grad()
def acceptance(heads: DraftHeads, adapter: ModelAdapter, sampling: SamplingConfig, data: DrafterData) -> list[float]:
    """Per head (in offset order), the mean of sum_x min(p, q) over every generated position of `data`'s images
    whose target position is in the image (module docstring)."""
    K = len(heads.offsets)
    embed = adapter.token_embeddings() if heads.config.tokens else None
    totals, counts = torch.zeros(K), torch.zeros(K)
    for rows in data.images:
        inputs, targets = zip(*(row_pairs(row, heads.offsets, None) for row in rows))
        mask = row_mask(rows[0], heads.offsets, None)  # [M, K]: every row of an image has the same positions
        device = adapter.device
        x = torch.stack(inputs).to(device)  # [copies, M, H]
        y = torch.stack(targets).to(device)  # [copies, M, K, H]
        M = x.shape[1]
        positions = (torch.arange(M)[:, None] + torch.as_tensor(heads.offsets)[None, :]).clamp(max=M - 1)
        predicted = heads(x.to(heads.up.dtype), embedded(heads, embed, rows, None))  # [copies, M, K, H]
        q = pipeline(adapter, sampling, predicted.flatten(1, 2), positions.flatten()[None])
        p = pipeline(adapter, sampling, y.flatten(1, 2), positions.flatten()[None])
        overlap = torch.minimum(p, q).sum(-1).view(M, K).cpu()
        totals += (overlap * mask).sum(0)
        counts += mask.sum(0)
    return (totals / counts.clamp(min=1)).tolist()


def pipeline(adapter: ModelAdapter, sampling: SamplingConfig, hidden: torch.Tensor, positions: torch.Tensor):
    """q (or p) [1, W, V] from hidden states of every CFG row [copies, W, H] at generated `positions` [1, W]."""
    logits: Logits = adapter.head(hidden)
    return logits_to_probs(logits, positions.to(hidden.device), adapter.layout, sampling)
