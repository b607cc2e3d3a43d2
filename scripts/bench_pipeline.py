"""How much of a decode the logits pipeline costs, before and after free-column filtering (sjd/bench/pipeline.py).

    python scripts/bench_pipeline.py [--repeats 5] [--batches 1,50] [--old-batches 1] [--grids 2]
                                     [--skip-pipeline] [--skip-decode] [--standin standin_lumina_512]

Prints ratios measured in this run; asserts nothing about time.

1. The pipeline alone: the implementation it replaced against sjd.core.sampling, logits -> probabilities plus the
   finite check, at each of `--batches`, best of `--repeats` calls in CPU time of one thread.
2. A decode: AR and SJD (window 16) on a tiny random Lumina-mGPT (`--grids` x `--grids` 32-px grids), or on a
   shipped stand-in with `--standin`, with Lumina's sampling, today's pipeline and (at `--old-batches`) the
   replaced one: the stage fractions of decode time, the efficiency and what the stage clock itself costs.
"""

from __future__ import annotations

import argparse

from sjd.bench.pipeline import print_benches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", default="1,50")
    ap.add_argument("--grids", type=int, default=2, help="32-px grids per side of the tiny Lumina image")
    ap.add_argument("--old-batches", default=None, help="batches decoded with the old pipeline too (default: all)")
    ap.add_argument("--standin", help="decode on this shipped stand-in (e.g. standin_lumina_512) instead")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-pipeline", action="store_true")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    old_batches = batches if args.old_batches is None else [int(b) for b in args.old_batches.split(",")]
    print_benches(batches, args.repeats, old_batches, args.grids, args.standin,
                  pipeline=not args.skip_pipeline, decode=not args.skip_decode)  # fmt: skip


if __name__ == "__main__":
    main()
