"""Train the toy text-to-image model from a seed and write its safetensors checkpoint (sjd.toy.training.train_toy).

    python scripts/train_toy.py                      # reproduces sjd/assets/toy (time: its config.json)
    python scripts/train_toy.py --steps 20 --out /tmp/toy   # a smoke run

The same seed, steps and thread count give the same weights. Captions are dropped (replaced by the NULL caption)
with probability `--cfg-dropout`, which is what makes classifier-free guidance work at sampling time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sjd.toy.training import ToyTrainSettings, train_toy

DEFAULT = ToyTrainSettings()
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "sjd" / "assets" / "toy"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=DEFAULT.seed)
    ap.add_argument("--steps", type=int, default=DEFAULT.steps)
    ap.add_argument("--batch-size", type=int, default=DEFAULT.batch_size)
    ap.add_argument("--lr", type=float, default=DEFAULT.lr)
    ap.add_argument("--warmup", type=int, default=DEFAULT.warmup)
    ap.add_argument("--cfg-dropout", type=float, default=DEFAULT.cfg_dropout)
    ap.add_argument("--threads", type=int, default=DEFAULT.threads, help="fixed so that runs are bit-reproducible")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = vars(ap.parse_args())
    out = args.pop("out")
    train_toy(ToyTrainSettings(**args), out)


if __name__ == "__main__":
    main()
