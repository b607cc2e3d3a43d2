"""Image-caption pairs -> SJD2 training shards for scripts/finetune_sjd2_hf.py, through the model's VQ encoder.

    python scripts/make_sjd2_shards.py --model lumina --base <Lumina-mGPT dir> --vqgan <Chameleon tokenizer dir> \\
        --pairs pairs.jsonl --out shards/lumina_768 --resolution 768 --device cuda
    python scripts/make_sjd2_shards.py --model emu3 --base <Emu3-Gen-hf dir> --pairs pairs.jsonl --out shards/emu3_720

`--pairs`: JSON lines {"image": <path, relative to the file's folder or absolute>, "caption": <text>}.
Each image is resized and centre-cropped to the square the layout's code grid covers (`--resolution`
for the real VQs: 48 x 16 px for Lumina-mGPT 768, 90 x 8 px for Emu3 720) and encoded by the model's own
VQ (Chameleon's VQGAN for Lumina-mGPT, the checkpoint's Emu3 VQ for Emu3); the caption becomes the
adapter's conditional prompt row. Only the tokenizer, config and VQ are loaded, not the LM weights.
Writes `shard-00000.safetensors`, ... of `--shard-size` sequences each (format: sjd/sjd2/data.py); the work is
`sjd.sjd2.encode.make_shards`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sjd.sjd2.encode import DEFAULT_RESOLUTION, make_shards


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(DEFAULT_RESOLUTION), required=True)
    ap.add_argument("--base", required=True, help="the base checkpoint (transformers format): tokenizer, config, VQ")
    ap.add_argument("--vqgan", default=None, help="lumina: directory with Chameleon's vqgan.yaml + vqgan.ckpt")
    ap.add_argument("--pairs", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resolution", type=int, default=None)
    ap.add_argument("--shard-size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8, help="images per VQ forward")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.model == "lumina" and not args.vqgan:
        ap.error("--model lumina needs --vqgan (Chameleon's image tokenizer directory)")
    return make_shards(args.model, args.base, args.pairs, args.out, args.vqgan, args.resolution, args.shard_size,
                       args.batch, args.device)  # fmt: skip


if __name__ == "__main__":
    main()
