"""Fine-tune Lumina-mGPT or Emu3 for SJD2's next-clean-token prediction (docs/algorithms.md §10): our recipe.

SJD2's fine-tuned checkpoints were never released. This script makes the noise-aware checkpoint
that `model=lumina_sjd2` / `model=emu3_sjd2` load, from a base checkpoint in transformers format
and pre-tokenised training shards:

    python scripts/finetune_sjd2_hf.py --model lumina --base <Lumina-mGPT-7B-768 dir> \\
        --data 'shards/*.safetensors' --out ckpt/lumina_sjd2 --device cuda --dtype bfloat16
    python scripts/finetune_sjd2_hf.py --model emu3 --base <Emu3-Gen-hf dir> --data ... --out ckpt/emu3_sjd2

Data: safetensors shards of prompt rows + image streams (format in sjd/sjd2/data.py), one image
size per run (`--resolution`, checked against every stream). Objective (sjd/sjd2/objective.py):
random noisy segments over image-code inputs only, never the prompt or the forced tokens;
ordinary next-token cross-entropy on the clean sequence; CFG dropout replaces the caption by the
adapter's unconditional row. Every input, clean ones included, goes through the adapter's noise
path (unit-RMS embeddings at the base table's RMS + timestep embedding), as at decode time.
Output: the fine-tuned model through `save_pretrained` (the base model's format and key names,
so the base loader reads it), its tokenizer, and `noise_aware.safetensors` / `noise_aware.json`
(noise levels, noise path, normalisation, base model, these settings and the losses). `--base`
may also be such a checkpoint, to continue training it.

Scale: this is a single-process full fine-tune, enough for tiny models and smoke runs. A 7B / 8B
full fine-tune (weights, gradients and AdamW state at ~16 bytes a parameter: over 110 GB before
activations) needs sharded training (FSDP or DeepSpeed ZeRO) over several GPUs, which this script
does not do. The paper's budget: 6 epochs, about 14 x 8 A100-hours (~112 A100-hours) for
Lumina-mGPT and 26 x 8 H100-hours for Emu3. Where the paper leaves room we chose: noise
levels uniform per token (the paper samples timesteps on a Karras schedule), one noisy segment
per sequence, prompts and forced tokens always clean, the vision tokenizer frozen.
"""

from __future__ import annotations

import argparse
import glob
import math
import time
import warnings
from pathlib import Path

import torch

from sjd.models.emu3 import Emu3Adapter
from sjd.models.lumina import LuminaAdapter
from sjd.sjd2.data import read_shards, uncond_row
from sjd.sjd2.emu3 import Emu3SJD2Adapter
from sjd.sjd2.inputs import save_checkpoint
from sjd.sjd2.lumina import LuminaSJD2Adapter
from sjd.sjd2.noise_path import N_LEVELS, SIDECAR_META, NoisePath
from sjd.sjd2.objective import make_batch, noise_plan, noisy_loss
from sjd.toy.training import lr_at

# family -> (plain adapter, noise-aware adapter, default resolution)
FAMILIES = {"lumina": (LuminaAdapter, LuminaSJD2Adapter, 768), "emu3": (Emu3Adapter, Emu3SJD2Adapter, 720)}


def load_adapter(family: str, base: str, resolution: int, device: str, dtype: str, n_levels: int):
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(FAMILIES), required=True)
    ap.add_argument("--base", required=True, help="base checkpoint (transformers format) or a noise-aware one")
    ap.add_argument("--data", nargs="+", required=True, help="shard files or globs (sjd/sjd2/data.py)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resolution", type=int, default=None, help="pixels; default 768 (lumina) / 720 (emu3)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--grad-accum", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--cfg-dropout", type=float, default=0.1, help="captions replaced by the unconditional row")
    ap.add_argument("--max-segment", type=int, default=128, help="longest noisy segment (above SJD2's window)")
    ap.add_argument("--clean-frac", type=float, default=0.2, help="sequences left clean, to keep AR quality")
    ap.add_argument("--noise-levels", type=int, default=N_LEVELS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--log-every", type=int, default=10)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    resolution = args.resolution or FAMILIES[args.model][2]
    torch.manual_seed(args.seed)
    adapter = load_adapter(args.model, args.base, resolution, args.device, args.dtype, args.noise_levels)
    examples = read_shards(shard_paths(args.data), args.model, adapter.layout)
    uncond, is_code = uncond_row(adapter), adapter.layout.free_tokens
    model, path = adapter.model, adapter.noise_path
    model.model.vqmodel.requires_grad_(False)  # the image tokenizer is not part of the objective
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train(), path.train()
    params = [p for p in [*model.parameters(), *path.parameters()] if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    per_step = args.batch_size * args.grad_accum
    print(f"SJD2 fine-tune of {args.base} ({args.model}, {resolution} px): {len(examples)} sequences, "
          f"{args.steps} steps of {per_step}", flush=True)  # fmt: skip

    start, losses = time.time(), []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        total = 0.0
        for micro in range(args.grad_accum):
            # Batches, dropout and noise are pure functions of (seed, step, micro): a run is reproducible.
            g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * args.grad_accum + micro)
            first = (step * args.grad_accum + micro) * args.batch_size
            batch = make_batch(
                examples, sample_order(len(examples), args.seed, args.batch_size, first), uncond, args.cfg_dropout, g
            )
            levels = noise_plan(batch, is_code, path.n_levels, args.max_segment, args.clean_frac, g)
            noise = torch.randn(*batch.inputs.shape, path.hidden_size, generator=g)
            loss = noisy_loss(adapter, batch, levels, noise) / args.grad_accum
            loss.backward()
            total += loss.item()
        if not math.isfinite(total):
            raise FloatingPointError(f"step {step}: loss {total}; lower --lr or check the data")
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"step {step:6d}  loss {total:.4f}  {time.time() - start:8.1f}s", flush=True)

    model.eval(), path.eval()
    meta = {
        "base_model": str(args.base),
        "train": {
            **{k: v for k, v in vars(args).items() if k not in ("base", "out", "data", "model")},
            "resolution": resolution,
            "data": [str(p) for p in shard_paths(args.data)],
            "sequences": len(examples),
            "losses": [round(x, 5) for x in losses],
            "minutes": round((time.time() - start) / 60, 2),
        },
    }
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.base, local_files_only=Path(args.base).is_dir())
    save_checkpoint(adapter, args.out, tokenizer, args.model, meta)
    print(f"wrote {args.out}", flush=True)
    return meta


if __name__ == "__main__":
    main()
