"""Training a stand-in on procedural images, in the adapter's own token layout.

Every training row is what the adapter decodes: the conditional prompt row of a caption (or, with
probability `p_uncond`, the one-token unconditional row, which is how CFG's unconditional branch
is learned) followed by the layout's tokens with the image's codes in the free positions. The loss
is cross-entropy over the code ids at code positions only: forced positions are never sampled.
For LlamaGen the row is its caption slots (or the learned null caption) then the codes. Batches
are a pure function of (seed, step).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from sjd.models.lumina import LuminaAdapter
from sjd.standin.procedural import ProceduralImages, all_themes


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 400
    batch_size: int = 8
    lr: float = 3e-3
    warmup: int = 20
    p_uncond: float = 0.15
    seed: int = 0


def image_tokens(adapter: LuminaAdapter, codes: np.ndarray) -> list[int]:
    """The layout's tokens with `codes` ([h, w] code indices) in its free positions."""
    tokens = adapter.layout.forced.clone()
    tokens[tokens < 0] = adapter.vocab.code_ids[torch.from_numpy(codes.reshape(-1)).long()]
    return tokens.tolist()


def make_batch(adapter: LuminaAdapter, images: ProceduralImages, settings: TrainSettings, step: int):
    """(ids [B, L] left-padded, attention mask, position ids, code-position index, code targets)."""
    rng = np.random.default_rng([settings.seed, step])
    themes, codebook, layout = all_themes(), images.codebook(), adapter.layout
    rows, first = [], []
    for _ in range(settings.batch_size):
        theme = themes[rng.integers(len(themes))]
        codes = images.sample(theme, layout.height, layout.width, rng, codebook)
        prompt = [adapter.vocab.end_of_turn] if rng.random() < settings.p_uncond else adapter.row_ids(theme.caption)
        rows.append(prompt + image_tokens(adapter, codes))
        first.append(len(prompt))
    width = max(len(r) for r in rows)
    pad = int(adapter.model.config.pad_token_id)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    free = (layout.forced < 0).nonzero().flatten()
    # the hidden state at index j predicts the token at j + 1
    where = torch.stack([width - len(r) + f + free - 1 for r, f in zip(rows, first)])  # [B, n_codes]
    targets = adapter._code_of_id[ids.gather(1, where + 1)]
    return ids, mask, positions, where, targets


def lr_at(step: int, settings: TrainSettings) -> float:
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def code_loss(adapter: LuminaAdapter, batch) -> torch.Tensor:
    ids, mask, positions, where, targets = batch
    hidden = adapter.model.model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
    picked = hidden.gather(1, where[..., None].expand(-1, -1, hidden.shape[-1]))
    logits = picked @ adapter.model.lm_head.weight[adapter.vocab.code_ids].T
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def code_features(images: ProceduralImages) -> torch.Tensor:
    """[n_codes, 4] each code's colour (centred) and its squared norm: where code embeddings start."""
    colours = torch.from_numpy(images.codebook()) - 0.5
    return torch.cat([colours, colours.pow(2).sum(1, keepdim=True)], 1)


@torch.no_grad()
def init_code_embeddings(adapter: LuminaAdapter, images: ProceduralImages) -> None:
    """Start each code's (tied) embedding at its colour and squared norm, plus the random rest: a real
    model's code embeddings come from a codebook-aware tokenizer, and training from this start takes
    minutes where learning 8192 embeddings from scratch would take hours on a CPU."""
    features = code_features(images)
    adapter.model.model.embed_tokens.weight[adapter.vocab.code_ids, : features.shape[1]] = features


@torch.no_grad()
def init_llamagen_code_embeddings(adapter, images: ProceduralImages) -> None:
    """As init_code_embeddings, for LlamaGen's untied input and output code tables (ids are code indices)."""
    features = code_features(images)
    adapter.gpt.tok_embeddings.weight[:, : features.shape[1]] = features
    adapter.gpt.output.weight[:, : features.shape[1]] = features


def llamagen_batch(adapter, images: ProceduralImages, settings: TrainSettings, step: int):
    """(captions, codes [B, n] code indices, which rows take the null caption [B] bool)."""
    rng = np.random.default_rng([settings.seed, step])
    themes, codebook, layout = all_themes(), images.codebook(), adapter.layout
    picked = [themes[rng.integers(len(themes))] for _ in range(settings.batch_size)]
    codes = np.stack([images.sample(t, layout.height, layout.width, rng, codebook) for t in picked])
    drop = torch.from_numpy(rng.random(len(picked)) < settings.p_uncond)
    return [t.caption for t in picked], torch.from_numpy(codes).reshape(len(picked), -1).long(), drop


def llamagen_code_loss(adapter, captions: list[str], codes: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the codes with LlamaGen's caption slots first; the learned null caption replaces
    the caption where `drop` (keeping its padding mask, as LlamaGen's CFG rows do). The T5 stays fixed."""
    gpt = adapter.gpt
    features, mask = adapter.encode_captions(captions)
    caption = torch.where(drop[:, None, None], gpt.uncond_caption(len(captions)), gpt.caption_embeddings(features))
    embeds = torch.cat([caption, gpt.tok_embeddings(codes[:, :-1])], 1)
    logits = gpt(embeds, prefix_mask=mask)[:, gpt.config.cls_token_num - 1 :]
    return F.cross_entropy(logits.flatten(0, 1), codes.flatten())


def llamagen_loss(adapter, images: ProceduralImages, settings: TrainSettings, step: int) -> torch.Tensor:
    return llamagen_code_loss(adapter, *llamagen_batch(adapter, images, settings, step))


def lumina_loss(adapter: LuminaAdapter, images: ProceduralImages, settings: TrainSettings, step: int) -> torch.Tensor:
    return code_loss(adapter, make_batch(adapter, images, settings, step))


def train(
    model: torch.nn.Module,
    loss_at,
    settings: TrainSettings,
    log_every: int = 25,
    probe_steps: int | None = None,
    probe_only: bool = False,
) -> list[dict]:
    """Train `model` in place on `loss_at(step)`; returns the loss log (nats per code token). With
    `probe_steps`, the log also records the weights' fingerprint after that many steps (`probe_fingerprint`,
    tensors_fingerprint), the cheap check of a recipe's code; with `probe_only` training stops there (on the
    full run's learning-rate schedule, so the fingerprint is the full run's)."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    history, t0 = [], time.perf_counter()
    for step in range(settings.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, settings)
        loss = loss_at(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % log_every == 0 or step == settings.steps - 1:
            history.append({"step": step, "loss": float(loss.detach()), "seconds": time.perf_counter() - t0})
            print(f"step {step:5d}  loss {float(loss.detach()):.3f} nats  {time.perf_counter() - t0:.0f}s", flush=True)
        if probe_steps is not None and step == probe_steps - 1:
            history.append({"step": step, "probe_fingerprint": tensors_fingerprint(model.state_dict())})
            if probe_only:
                break
    model.eval()
    return history


# Projections per tensor in a fingerprint, and the gap (in units of a tensor's rms) below which two fingerprints
# are the same training. The same recipe on another CPU instruction set (AVX2 against AVX-512, or PyTorch's
# baseline kernels) rounds differently: after the probe's 3 steps the weights of the calibrated stand-ins differ
# by about 1e-6 of a tensor's norm. A changed recipe moves them by 3e-2 or more (a 3% change of the texture
# noise, of the learning rate, or of the row tint), so 1e-4 lies about 80 times above the first and 300 times
# below the second.
FINGERPRINT_PROJECTIONS = 4
FINGERPRINT_TOLERANCE = 1e-4


def tensors_fingerprint(tensors: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Per named tensor: its rms, then its projections on FINGERPRINT_PROJECTIONS fixed Gaussian directions,
    each divided by sqrt(numel) (so a change of the weights moves a projection by about its rms). Unlike a
    sha256 it survives a CPU's rounding: compare two with fingerprint_gaps."""
    out = {}
    for name in sorted(tensors):
        w = tensors[name].detach().cpu().double().flatten()
        seed = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
        directions = torch.randn(FINGERPRINT_PROJECTIONS, w.numel(), generator=torch.Generator().manual_seed(seed),
                                 dtype=torch.float64)  # fmt: skip
        scale = max(w.numel(), 1) ** 0.5
        out[name] = [float(w.norm() / scale), *(float(v) for v in directions @ w / scale)]
    return out


def fingerprint_gaps(ours: dict[str, list[float]], theirs: dict[str, list[float]]) -> dict[str, float]:
    """The largest gap of each tensor's fingerprint entries in units of its rms (theirs); inf for a tensor only
    one side has. Two trainings are the same where every gap is below FINGERPRINT_TOLERANCE."""
    gaps = {name: float("inf") for name in ours.keys() ^ theirs.keys()}
    for name in ours.keys() & theirs.keys():
        a, b = ours[name], theirs[name]
        if len(a) != len(b):  # fingerprinted with another FINGERPRINT_PROJECTIONS: not comparable
            gaps[name] = float("inf")
            continue
        gaps[name] = max(abs(x - y) for x, y in zip(a, b)) / max(abs(b[0]), 1e-12)
    return gaps
