"""Fine-tune the shipped toy model for SJD2's next-clean-token prediction (docs/algorithms.md §10), by
sjd.sjd2.toy_finetune.

    python scripts/finetune_sjd2.py                        # reproduces sjd/assets/toy_sjd2 (time: its config.json)
    python scripts/finetune_sjd2.py --steps 5 --out /tmp/sjd2   # a smoke run

Starting from `--base` (sjd/assets/toy), each training sequence gets (with probability 1 - --clean-frac) one
random segment of image-stream inputs noised, every token at its own noise level; the loss stays the ordinary
next-token cross-entropy on the clean sequence. The run is reproducible at a fixed thread count.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sjd.sjd2.toy_finetune import TOY, TOY_SJD2, ToyFineTuneSettings, finetune_toy

DEFAULT = ToyFineTuneSettings()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=DEFAULT.seed)
    ap.add_argument("--steps", type=int, default=DEFAULT.steps)
    ap.add_argument("--batch-size", type=int, default=DEFAULT.batch_size)
    ap.add_argument("--lr", type=float, default=DEFAULT.lr)
    ap.add_argument("--warmup", type=int, default=DEFAULT.warmup)
    ap.add_argument("--cfg-dropout", type=float, default=DEFAULT.cfg_dropout)
    ap.add_argument("--max-segment", type=int, default=DEFAULT.max_segment,
                    help="longest noisy segment (SJD2's window is below it)")  # fmt: skip
    ap.add_argument("--clean-frac", type=float, default=DEFAULT.clean_frac,
                    help="sequences left clean, to keep AR quality")  # fmt: skip
    ap.add_argument("--threads", type=int, default=DEFAULT.threads)
    ap.add_argument("--base", type=Path, default=TOY)
    ap.add_argument("--out", type=Path, default=TOY_SJD2)
    args = vars(ap.parse_args())
    base, out = args.pop("base"), args.pop("out")
    finetune_toy(ToyFineTuneSettings(**args), base, out)


if __name__ == "__main__":
    main()
