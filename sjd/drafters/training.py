"""Training an EAGLE drafter on the target's features (the recipe of EAGLE and LANTERN, at our sizes).

Pairs. Row position j holds (f_j, id_{j+1}) and learns f_{j+1}: EAGLE's pairing, the one every drafter uses at
inference (LANTERN's Chameleon training path pairs f_j with id_j, one token behind; we do not).

Rows. Each image gives one row a step: the conditional row with probability 1 - p_uncond, else the
unconditional one (LANTERN's Chameleon recipe, p_uncond 0.1); the drafter runs both at inference.

Loss, on the positions whose target feature is a generated one (f_{P-1+1} .. f_{P+N-2}: the image part; the
prompt's features are inputs only, and the last token has no feature to learn):

    SmoothL1(pred, f_{j+1}) averaged over H  +  p_weight * CE(softmax(head(f_{j+1})), log_softmax(head(pred)))

with the target's own LM head on the single row's raw logits (no CFG, no grammar: EAGLE's and LANTERN's
soft labels), averaged over the positions of the batch. Uniform noise (U(0,1) - 0.5) * noise_std * 512 / L
goes on the input features only (L the row's length). The head is the target's own (`target_head`: one matrix
product read off `adapter.head` where that head is affine, else the adapter's head run with gradients); the
target's parameters never change, and gradients are only asked of the drafter's (`torch.autograd.grad`).

Optimiser. AdamW (betas 0.9, 0.95, weight decay 0.01) on every drafter weight but the frozen embedding, each
gradient clipped to +-0.5 by value, the learning rate warming up linearly over 3% of one epoch's steps, then
decaying linearly to 0 over the rest of training. The network runs over whole rows with a fresh zero cache per
batch (slot = position, causal mask), the same code as at inference.

Everything random is a pure function of (seed, step): the epoch's image order, each image's row, the noise. So
a run stopped at a checkpoint (model, optimiser, schedule, step; written every `checkpoint_every` steps) and
resumed ends with the same weights, bit for bit, as one that never stopped.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Self

import numpy as np
import torch
import torch.nn.functional as F

from sjd.drafters.data import DrafterData, Row
from sjd.drafters.net import DrafterNet, config_from_architecture
from sjd.models.base import ModelAdapter


class RecipeSettings:
    """What a recipe's `train` settings dataclass reads from and writes to its record (both recipes share it)."""

    @classmethod
    def from_dict(cls, values: dict) -> Self:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"train: unknown setting(s) {unknown} (settings: {sorted(known)})")
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TrainSettings(RecipeSettings):
    epochs: int = 10
    lr: float = 1e-3
    batch_size: int = 4  # rows (images) per step
    p_uncond: float = 0.1  # probability an image gives its unconditional row (with CFG)
    noise_std: float = 0.2
    p_weight: float = 0.1  # weight of the soft cross-entropy beside the feature regression
    warmup_frac: float = 0.03  # of one epoch's steps
    clip_value: float = 0.5
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("epochs", "lr", "batch_size", "clip_value")
        bad = [f"train.{k}={getattr(self, k)!r} (must be > 0)" for k in positive if not getattr(self, k) > 0]
        unit = ("p_uncond", "warmup_frac", "beta1", "beta2")
        bad += [f"train.{k}={getattr(self, k)!r} (must be in [0, 1])" for k in unit if not 0 <= getattr(self, k) <= 1]
        bad += [f"train.{k}={getattr(self, k)!r} (must be >= 0)" for k in ("noise_std", "p_weight", "weight_decay")
                if not getattr(self, k) >= 0]  # fmt: skip
        if bad:
            raise ValueError("bad training settings: " + "; ".join(bad))


def steps_per_epoch(n_images: int, settings: TrainSettings) -> int:
    return math.ceil(n_images / settings.batch_size)


def lr_factor(step: int, per_epoch: int, settings: TrainSettings) -> float:
    """Linear warmup over warmup_frac of one epoch's steps (the first step already moves), then linear decay."""
    total = per_epoch * settings.epochs
    warmup = max(1, math.ceil(settings.warmup_frac * per_epoch))
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def step_seed(settings: TrainSettings, step: int, what: int) -> int:
    digest = hashlib.sha256(f"{settings.seed}:{step}:{what}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def batch_rows(data: DrafterData, step: int, settings: TrainSettings) -> list[Row]:
    """The rows of `step`: images in the epoch's seeded order, each its conditional row or, with probability
    p_uncond (when it has one), its unconditional row."""
    per_epoch = steps_per_epoch(len(data), settings)
    epoch, within = divmod(step, per_epoch)
    order = np.random.default_rng(step_seed(settings, epoch, 0)).permutation(len(data))
    picked = order[within * settings.batch_size : (within + 1) * settings.batch_size]
    coins = np.random.default_rng(step_seed(settings, step, 1)).random(len(picked))
    rows = []
    for image, coin in zip(picked, coins):
        choices = data.images[image]
        rows.append(choices[1] if len(choices) > 1 and coin < settings.p_uncond else choices[0])
    return rows


@dataclass
class Batch:
    tokens: torch.Tensor  # [R, T] id_{j+1}
    features: torch.Tensor  # [R, T, H] f_j (noisy)
    targets: torch.Tensor  # [R, T, H] f_{j+1}
    learn: torch.Tensor  # [R, T] bool: the target is a generated position's feature


def collate(rows: list[Row], step: int, settings: TrainSettings, device: torch.device) -> Batch:
    """Right-padded pairs of `rows` with the input noise of `step` (drawn on the CPU, so any device gets the
    same numbers). Padding pairs are never learnt, and no real pair attends to them (they come after it)."""
    lengths = [len(r.features) - 1 for r in rows]
    R, T, H = len(rows), max(lengths), rows[0].features.shape[1]
    tokens = torch.zeros(R, T, dtype=torch.long)
    features, targets = torch.zeros(R, T, H), torch.zeros(R, T, H)
    learn = torch.zeros(R, T, dtype=torch.bool)
    gen = torch.Generator().manual_seed(step_seed(settings, step, 2))
    for r, (row, L) in enumerate(zip(rows, lengths)):
        f = row.features.float()
        noise = (torch.rand(L, H, generator=gen) - 0.5) * settings.noise_std * 512 / L
        tokens[r, :L] = row.ids[1 : L + 1]
        features[r, :L] = f[:L] + noise
        targets[r, :L] = f[1 : L + 1]
        learn[r, row.prompt_len - 1 : L] = True
    return Batch(tokens.to(device), features.to(device), targets.to(device), learn.to(device))


def head_rows(adapter: ModelAdapter, hidden: torch.Tensor, method=None) -> torch.Tensor:
    """`adapter.head` (or `method`, the same function unwrapped) on hidden states [M, H] -> raw logits [M, V]. The
    rows go in as two halves, so whatever CFG split the adapter applies to its rows (conditional, unconditional),
    concatenating its parts gives them back in order. An adapter splits by the CFG state of its last prefill, so
    one must have run."""
    M = hidden.shape[0]
    even = torch.cat([hidden, hidden[: M % 2]])
    logits = (method or type(adapter).head)(adapter, even.view(2, -1, hidden.shape[-1]))
    parts = [logits.cond] + ([logits.uncond] if logits.uncond is not None else [])
    return torch.cat(parts).reshape(len(even), -1)[:M].float()


def affine_head(adapter: ModelAdapter, hidden_size: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(W [H, V], b [V]) with head(x) = x @ W + b, read off the head at 0 and at the unit vectors, when the head
    is affine (every adapter's but Janus's MLP head): checked on seeded random states, within a bfloat16 head's
    rounding (a curved head misses by far more). None when it is not."""
    device = adapter.device
    with torch.no_grad():
        probe = torch.cat([torch.zeros(1, hidden_size), torch.eye(hidden_size)]).to(device)
        rows = head_rows(adapter, probe)
        b, W = rows[0], rows[1:] - rows[:1]
        x = torch.randn(8, hidden_size, generator=torch.Generator().manual_seed(0)).to(device)
        direct, ours = head_rows(adapter, x), torch.addmm(b, x, W)
    scale = float(direct.abs().max()) + 1e-6
    return (W, b) if float((direct - ours).abs().max()) <= 2e-2 * scale else None


def target_head(adapter: ModelAdapter) -> Callable[[torch.Tensor], torch.Tensor]:
    """The target's LM head as a differentiable function hidden [M, H] -> raw logits [M, V] (the target's weights
    never change). An affine head becomes one matrix product (`affine_head`); any other runs the adapter's `head`
    without the no_grad wrapper it has for decoding. Call after a prefill (head_rows)."""
    hidden_size = adapter.token_embeddings().shape[1]
    affine = affine_head(adapter, hidden_size)
    if affine is not None:
        W, b = affine
        return lambda hidden: torch.addmm(b, hidden.float(), W)
    method = type(adapter).head
    raw = getattr(method, "__wrapped__", method)

    def head(hidden: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            out = head_rows(adapter, hidden, raw)
        if hidden.requires_grad and not out.requires_grad:
            raise ValueError(f"model {adapter.name!r}: its head gives no gradients; a drafter cannot train on it")
        return out

    return head


def init_drafter(adapter: ModelAdapter, seed: int) -> DrafterNet:
    """A drafter of the target's layer family in float32, seeded, with the target's embedding (frozen)."""
    cfg = config_from_architecture(adapter.architecture())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = DrafterNet(cfg)
    with torch.no_grad():
        net.embed_tokens.weight.copy_(adapter.token_embeddings().detach().float().cpu())
    return net.to(adapter.device)


def trainable(net: DrafterNet) -> list[torch.nn.Parameter]:
    return [p for p in net.parameters() if p.requires_grad]


# Positions per piece of the soft cross-entropy: its [positions, vocabulary] logits are made and differentiated a
# piece at a time, so a real model's 65536-id head over a 2400-position row never holds them all at once.
CE_CHUNK = 512


def drafter_forward(net: DrafterNet, batch: Batch) -> torch.Tensor:
    """Predicted features [R, T, H] over whole rows, through a fresh zero cache (slot = position, causal)."""
    R, T = batch.tokens.shape
    cfg, device = net.config, batch.tokens.device
    kv = [tuple(torch.zeros(R, cfg.num_key_value_heads, T, cfg.head_dim, device=device) for _ in range(2))]
    positions = torch.arange(T, device=device)[None].expand(R, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()[None].expand(R, T, T)
    return net(batch.tokens, batch.features, positions, kv, positions, causal)


def soft_cross_entropy(
    head, pred: torch.Tensor, target: torch.Tensor, agreement: bool = True
) -> tuple[float, torch.Tensor, float | None]:
    """Mean over positions of CE(softmax(head(target)), log_softmax(head(pred))), its gradient with respect to
    `pred` [M, H], and (with `agreement`) the share of positions where both heads' top ids agree; computed
    CE_CHUNK positions at a time."""
    M = len(pred)
    total, agree = 0.0, 0
    grad = torch.zeros_like(pred)
    for start in range(0, M, CE_CHUNK):
        piece = pred[start : start + CE_CHUNK].detach().requires_grad_(True)
        with torch.no_grad():
            target_logits = head(target[start : start + CE_CHUNK])
            soft_labels = target_logits.softmax(-1)
        logits = head(piece)
        ce = F.cross_entropy(logits, soft_labels, reduction="sum") / M
        (grad[start : start + CE_CHUNK],) = torch.autograd.grad(ce, piece)
        total += float(ce.detach())
        if agreement:
            agree += int((logits.detach().argmax(-1) == target_logits.argmax(-1)).sum())
    return total, grad, agree / max(M, 1) if agreement else None


def batch_gradients(
    net: DrafterNet, head, batch: Batch, settings: TrainSettings, agreement: bool = True
) -> tuple[list[torch.Tensor], dict]:
    """The gradients of the recipe's loss on one batch with respect to the drafter's trainable weights (never the
    target's), and the loss and its parts: regression, soft cross-entropy and (with `agreement`) the top-1
    agreement of the two heads."""
    pred = drafter_forward(net, batch)[batch.learn]
    target = batch.targets[batch.learn]
    regression = F.smooth_l1_loss(pred, target, reduction="none").mean(-1).mean()
    cross_entropy, ce_grad, agree = soft_cross_entropy(head, pred, target, agreement)
    grads = torch.autograd.grad([regression, pred], trainable(net),
                                grad_outputs=[torch.ones_like(regression), settings.p_weight * ce_grad])  # fmt: skip
    loss = float(regression.detach()) + settings.p_weight * cross_entropy
    return list(grads), {"loss": loss, "regression": float(regression.detach()), "cross_entropy": cross_entropy,
                         "top1": agree}  # fmt: skip


@dataclass
class Optimiser:
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR


def make_optimiser(net: DrafterNet, per_epoch: int, settings: TrainSettings) -> Optimiser:
    optimizer = torch.optim.AdamW(
        trainable(net), lr=settings.lr, betas=(settings.beta1, settings.beta2), weight_decay=settings.weight_decay
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, per_epoch, settings))
    return Optimiser(optimizer, schedule)


def train_step(
    net: DrafterNet, head, opt: Optimiser, batch: Batch, settings: TrainSettings, agreement: bool = True
) -> dict:
    params = trainable(net)
    grads, log = batch_gradients(net, head, batch, settings, agreement)
    for p, g in zip(params, grads):
        p.grad = g
    torch.nn.utils.clip_grad_value_(params, settings.clip_value)
    lr = opt.optimizer.param_groups[0]["lr"]
    opt.optimizer.step()
    opt.schedule.step()
    for p in params:
        p.grad = None
    return {**log, "lr": lr}


def save_state(
    path: Path, net: DrafterNet, opt: Optimiser, step: int, meta: dict, history: list[dict], seconds: float
) -> None:
    """The training state after `step` steps, written whole or not at all."""
    state = {
        "model": {k: v.detach().cpu() for k, v in net.state_dict().items()},
        "optimizer": opt.optimizer.state_dict(),
        "schedule": opt.schedule.state_dict(),
        "step": step,
        "torch_rng": torch.get_rng_state(),
        "meta": meta,
        "history": history,
        "seconds": seconds,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_state(path: Path, net: DrafterNet, opt: Optimiser, meta: dict) -> tuple[int, list[dict], float]:
    """Restore a training state; refused (naming both) when it was written by another recipe or data."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    differ = {k: (state["meta"].get(k), v) for k, v in meta.items() if state["meta"].get(k) != v}
    if differ:
        parts = "; ".join(f"{k} {theirs!r} (this run's: {ours!r})" for k, (theirs, ours) in differ.items())
        raise ValueError(f"{path}: a training state of another run: {parts}; delete it to start afresh")
    net.load_state_dict(state["model"])
    opt.optimizer.load_state_dict(state["optimizer"])
    opt.schedule.load_state_dict(state["schedule"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"]), list(state["history"]), float(state["seconds"])


def train(
    net: DrafterNet,
    head,
    data: DrafterData,
    settings: TrainSettings,
    *,
    state_path: Path | None = None,
    checkpoint_every: int = 100,
    meta: dict | None = None,
    max_steps: int | None = None,
    on_step: Callable[[int, dict], None] = lambda step, log: None,
    log_every: int | None = None,
) -> list[dict]:
    """Train `net` in place; returns its log (every `log_every` steps and the last). With `state_path`, a state
    is written every `checkpoint_every` steps and a run finding one resumes from it (`meta`, the recipe and data
    hashes, must match). `max_steps` stops early (a probe: the first steps of the same schedule); `on_step(step,
    log)` is called after every step (progress)."""
    per_epoch = steps_per_epoch(len(data), settings)
    total = per_epoch * settings.epochs if max_steps is None else min(max_steps, per_epoch * settings.epochs)
    log_every = log_every or max(1, total // 20)
    opt = make_optimiser(net, per_epoch, settings)
    meta = meta or {}
    step, history, seconds = 0, [], 0.0
    if state_path is not None and state_path.is_file():
        step, history, seconds = load_state(state_path, net, opt, meta)
    net.train()
    device = next(net.parameters()).device
    t0 = time.perf_counter() - seconds  # a resumed run counts the time its state had taken
    while step < total:
        batch = collate(batch_rows(data, step, settings), step, settings, device)
        logged = (step + 1) % log_every == 0 or step + 1 == total
        log = train_step(net, head, opt, batch, settings, agreement=logged)  # agreement costs a pass: logged steps
        step += 1
        log = {"step": step, **log, "seconds": round(time.perf_counter() - t0, 1)}
        if logged:
            history.append(log)
        if state_path is not None and step % checkpoint_every == 0 and step < total:
            save_state(state_path, net, opt, step, meta, history, time.perf_counter() - t0)
        on_step(step, log)
    net.eval()
    return history
