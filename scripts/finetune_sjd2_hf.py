"""Fine-tune Lumina-mGPT or Emu3 for SJD2's next-clean-token prediction (docs/algorithms.md §10): our recipe.

SJD2's fine-tuned checkpoints were never released. This script makes the noise-aware checkpoint
that `model=lumina_sjd2` / `model=emu3_sjd2` load, from a base checkpoint in transformers format
and pre-tokenised training shards:

    python scripts/finetune_sjd2_hf.py --model lumina --base <Lumina-mGPT-7B-768 dir> \\
        --data 'shards/*.safetensors' --out ckpt/lumina_sjd2 --device cuda --dtype bfloat16
    python scripts/finetune_sjd2_hf.py --model emu3 --base <Emu3-Gen-hf dir> --data ... --out ckpt/emu3_sjd2

Data: safetensors shards of prompt rows + image streams (format in sjd/sjd2/data.py), one image
size per run (`--resolution`, checked against every stream). The recipe and its objective are
`sjd.sjd2.finetune` (sjd/sjd2/finetune.py); this script is its command line. Output: the fine-tuned
model through `save_pretrained` (the base model's format and key names, so the base loader reads
it), its tokenizer, and `noise_aware.safetensors` / `noise_aware.json`
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
from pathlib import Path

from sjd.sjd2.finetune import FAMILIES, FineTuneSettings, finetune

DEFAULT = FineTuneSettings()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(FAMILIES), required=True)
    ap.add_argument("--base", required=True, help="base checkpoint (transformers format) or a noise-aware one")
    ap.add_argument("--data", nargs="+", required=True, help="shard files or globs (sjd/sjd2/data.py)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resolution", type=int, default=None, help="pixels; default 768 (lumina) / 720 (emu3)")
    ap.add_argument("--steps", type=int, default=DEFAULT.steps)
    ap.add_argument("--batch-size", type=int, default=DEFAULT.batch_size)
    ap.add_argument("--grad-accum", type=int, default=DEFAULT.grad_accum)
    ap.add_argument("--lr", type=float, default=DEFAULT.lr)
    ap.add_argument("--warmup", type=int, default=DEFAULT.warmup)
    ap.add_argument("--weight-decay", type=float, default=DEFAULT.weight_decay)
    ap.add_argument("--cfg-dropout", type=float, default=DEFAULT.cfg_dropout,
                    help="captions replaced by the unconditional row")  # fmt: skip
    ap.add_argument("--max-segment", type=int, default=DEFAULT.max_segment,
                    help="longest noisy segment (above SJD2's window)")  # fmt: skip
    ap.add_argument("--clean-frac", type=float, default=DEFAULT.clean_frac,
                    help="sequences left clean, to keep AR quality")  # fmt: skip
    ap.add_argument("--noise-levels", type=int, default=DEFAULT.noise_levels)
    ap.add_argument("--seed", type=int, default=DEFAULT.seed)
    ap.add_argument("--device", default=DEFAULT.device)
    ap.add_argument("--dtype", default=DEFAULT.dtype, choices=["float32", "bfloat16"])
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--log-every", type=int, default=DEFAULT.log_every)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = vars(parse_args(argv))
    model, base, data, out = (args.pop(k) for k in ("model", "base", "data", "out"))
    return finetune(model, base, data, out, FineTuneSettings(**args))


if __name__ == "__main__":
    main()
