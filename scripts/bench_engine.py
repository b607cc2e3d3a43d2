"""Eager against compiled, dynamic against static cache: each decoder's latency on three engines, in one run
(sjd/bench/engine.py says what is timed and how).

    python scripts/bench_engine.py [--model standin_lumina_512_cal] [--decoders ar,sjd,csjd,csjd_pac]
                                   [--window 16] [--batches 1,8] [--prompts 3] [--out results/engine.csv]

The engines are the run config's `cache` and `compile` (docs/evaluation.md): `eager_dynamic`, `eager_static` and
`compiled_static`. Per (decoder, engine, batch size) it prints latency per image, host time per forward outside
the model, the speedups over the same decoder on `eager_dynamic` and over AR on the same engine with 95%
bootstrap intervals over the prompt batches, and the warm-up's seconds. Syncs per iteration are
`scripts/count_syncs.py`'s. Prints ratios measured in this run; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sjd.bench.engine import bench_engine


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="standin_lumina_512_cal", help="a conf/model/ config")
    ap.add_argument("--decoders", default="ar,sjd,csjd,csjd_pac", help="comma-separated conf/decoder/ names")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--batches", type=ints, default=[1, 8])
    ap.add_argument("--prompts", type=int, default=3, help="prompt batches of each size: the timing units")
    ap.add_argument("--out", type=Path, default=None, help="write the table here (results/engine.csv is ours)")
    args = ap.parse_args()
    command = shlex.join(["python", *sys.argv])
    bench_engine(args.model, args.decoders.split(","), args.window, args.batches, args.prompts, command, args.out)


if __name__ == "__main__":
    main()
