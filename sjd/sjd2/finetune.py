"""SJD2's fine-tune of a real model (Lumina-mGPT, Emu3) for next-clean-token prediction: our recipe.

SJD2's fine-tuned checkpoints were never released; `finetune` makes the noise-aware checkpoint that
`model=lumina_sjd2` / `model=emu3_sjd2` load, from a base checkpoint in transformers format and
pre-tokenised training shards (format in sjd/sjd2/data.py). scripts/finetune_sjd2_hf.py is its
command line; docs/algorithms.md §10 describes the objective.

Objective (sjd/sjd2/objective.py): random noisy segments over image-code inputs only, never the
prompt or the forced tokens; ordinary next-token cross-entropy on the clean sequence; CFG dropout
replaces the caption by the adapter's unconditional row. Every input, clean ones included, goes
through the adapter's noise path (unit-RMS embeddings at the base table's RMS + timestep
embedding), as at decode time. Batches, dropout and noise are pure functions of (seed, step,
micro-batch), so a run is reproducible.
"""

from __future__ import annotations

import glob
import math
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from sjd.models.emu3 import Emu3Adapter
from sjd.models.lumina import LuminaAdapter
from sjd.sjd2.data import read_shards, uncond_row
from sjd.sjd2.emu3 import Emu3SJD2Adapter
from sjd.sjd2.inputs import NoiseAwareInputs, save_checkpoint
from sjd.sjd2.lumina import LuminaSJD2Adapter
from sjd.sjd2.noise_path import N_LEVELS, SIDECAR_META, NoisePath
from sjd.sjd2.objective import make_batch, noise_plan, noisy_loss
from sjd.toy.training import lr_at

# family -> (plain adapter, noise-aware adapter, default resolution)
FAMILIES = {"lumina": (LuminaAdapter, LuminaSJD2Adapter, 768), "emu3": (Emu3Adapter, Emu3SJD2Adapter, 720)}


@dataclass(frozen=True)
class FineTuneSettings:
    """Everything of a fine-tune but its model, base checkpoint, data and output (recorded in the
    checkpoint's noise_aware.json, in this order)."""

    resolution: int | None = None  # pixels; None: the family's default (FAMILIES)
    steps: int = 1000
    batch_size: int = 1
    grad_accum: int = 8
    lr: float = 1e-5
    warmup: int = 50
    weight_decay: float = 0.0
    cfg_dropout: float = 0.1  # share of captions replaced by the unconditional row
    max_segment: int = 128  # longest noisy segment (above SJD2's window)
    clean_frac: float = 0.2  # share of sequences left clean, to keep AR quality
    noise_levels: int = N_LEVELS
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    log_every: int = 10


def load_adapter(family: str, base: str, resolution: int, device: str, dtype: str, n_levels: int) -> NoiseAwareInputs:
    """The noise-aware adapter to train: a fresh NoisePath (zero timestep embedding, the base table's
    RMS as scale) on a plain base checkpoint, or the path of a noise-aware one to continue."""
    plain, noise_aware, _ = FAMILIES[family]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*cannot be decoded to images")  # Lumina: no VQGAN needed
        if (Path(base) / SIDECAR_META).is_file():
            return noise_aware(weights=base, device=device, resolution=resolution, dtype=dtype)
        adapter = plain(weights=base, device=device, resolution=resolution, dtype=dtype)
    path = NoisePath.for_table(adapter.model.get_input_embeddings().weight, n_levels)
    return noise_aware.wrap(adapter, path)


def shard_paths(patterns: list[str]) -> list[Path]:
    """The shard files that `patterns` (files or globs) name; a missing one is refused."""
    paths = sorted({Path(p) for pattern in patterns for p in (glob.glob(pattern) or [pattern])})
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"--data: no shard at {missing} (see sjd/sjd2/data.py for the format)")
    return paths


def sample_order(n: int, seed: int, count: int, start: int) -> list[int]:
    """Example indices start .. start + count - 1 of a stream of per-epoch permutations: every
    example once per epoch, in an order fixed by the seed."""
    out = []
    for k in range(start, start + count):
        epoch, i = divmod(k, n)
        out.append(int(torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch))[i]))
    return out


def train(adapter: NoiseAwareInputs, examples: list, settings: FineTuneSettings) -> list[float]:
    """`settings.steps` AdamW steps on `examples`; the loss of every step."""
    s = settings
    uncond, is_code = uncond_row(adapter), adapter.layout.free_tokens
    model, path = adapter.model, adapter.noise_path
    model.model.vqmodel.requires_grad_(False)  # the image tokenizer is not part of the objective
    if s.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train(), path.train()
    params = [p for p in [*model.parameters(), *path.parameters()] if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=s.lr, betas=(0.9, 0.95), weight_decay=s.weight_decay)
    start, losses = time.time(), []
    for step in range(s.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s.steps, s.lr, s.warmup)
        total = 0.0
        for micro in range(s.grad_accum):
            g = torch.Generator().manual_seed(s.seed * 1_000_003 + step * s.grad_accum + micro)
            first = (step * s.grad_accum + micro) * s.batch_size
            batch = make_batch(examples, sample_order(len(examples), s.seed, s.batch_size, first), uncond,
                               s.cfg_dropout, g)  # fmt: skip
            levels = noise_plan(batch, is_code, path.n_levels, s.max_segment, s.clean_frac, g)
            noise = torch.randn(*batch.inputs.shape, path.hidden_size, generator=g)
            loss = noisy_loss(adapter, batch, levels, noise) / s.grad_accum
            loss.backward()
            total += loss.item()
        if not math.isfinite(total):
            raise FloatingPointError(f"step {step}: loss {total}; lower --lr or check the data")
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
        if step % s.log_every == 0 or step == s.steps - 1:
            print(f"step {step:6d}  loss {total:.4f}  {time.time() - start:8.1f}s", flush=True)
    model.eval(), path.eval()
    return losses


def finetune(family: str, base: str, data: list[str], out: Path, settings: FineTuneSettings) -> dict:
    """Fine-tune `base` (a `family` checkpoint, plain or noise-aware) on the shards `data` names and
    write the noise-aware checkpoint to `out`; the training record it holds."""
    resolution = settings.resolution or FAMILIES[family][2]
    torch.manual_seed(settings.seed)
    adapter = load_adapter(family, base, resolution, settings.device, settings.dtype, settings.noise_levels)
    examples = read_shards(shard_paths(data), family, adapter.layout)
    per_step = settings.batch_size * settings.grad_accum
    print(f"SJD2 fine-tune of {base} ({family}, {resolution} px): {len(examples)} sequences, "
          f"{settings.steps} steps of {per_step}", flush=True)  # fmt: skip
    start = time.time()
    losses = train(adapter, examples, settings)
    meta = {
        "base_model": str(base),
        "train": {
            **asdict(settings),
            "resolution": resolution,
            "data": [str(p) for p in shard_paths(data)],
            "sequences": len(examples),
            "losses": [round(x, 5) for x in losses],
            "minutes": round((time.time() - start) / 60, 2),
        },
    }
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=Path(base).is_dir())
    save_checkpoint(adapter, out, tokenizer, family, meta)
    print(f"wrote {out}", flush=True)
    return meta
