"""Train the toy CLIP, the toy model's CLIP score and FID feature network (sjd.toy.clip_training).

    python scripts/train_toy_clip.py                       # reproduces sjd/assets/toy_clip (time: its config.json)
    python scripts/train_toy_clip.py --steps 5 --out /tmp/clip   # a smoke run

Prints its progress and, at the end, how often an image's own caption scores above every other caption of a
held-out batch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sjd.toy.clip import DEFAULT_DIR
from sjd.toy.clip_training import ClipTrainSettings, train_toy_clip

DEFAULT = ClipTrainSettings()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=DEFAULT.seed)
    ap.add_argument("--steps", type=int, default=DEFAULT.steps)
    ap.add_argument("--batch-size", type=int, default=DEFAULT.batch_size)
    ap.add_argument("--lr", type=float, default=DEFAULT.lr)
    ap.add_argument("--threads", type=int, default=DEFAULT.threads)
    ap.add_argument("--out", type=Path, default=DEFAULT_DIR)
    args = vars(ap.parse_args())
    out = args.pop("out")
    train_toy_clip(ClipTrainSettings(**args), out)


if __name__ == "__main__":
    main()
