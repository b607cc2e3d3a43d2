"""Per-iteration bookkeeping of every decoder, in ms and as a ratio to SJD's, at windows 16 and 64.

    python scripts/bench_bookkeeping.py [--model standin_lumina_512] [--prompts 2] [--windows 16,64]
                                        [--batches 1,8] [--decoders ar,sjd,...] [--wall] [--out CSV]

Bookkeeping is a decode's time outside the model forward (draft, logits pipeline, verify, commit,
other: sjd/decoders/stages.py) over the forwards of its decode loop. On a GPU a 7B model's window
forward costs milliseconds, so bookkeeping that is negligible next to a 2-layer stand-in's forward on
a CPU can decide the latency there; the ratio to SJD says which decoders' per-iteration work grows with
the window or the branch count. Also printed: outside_model_frac and the stage split of decode time,
per batch size. Every decoder of conf/decoder/ runs (or `--decoders`), built from its config as the
runner builds it; those whose required capabilities the model lacks are skipped, with a message.
`--prompts N`: N batches of each size per decoder. One run, decoders alternating their order, one
torch thread, the decoders' clocks reading CPU time (`--wall` for wall time): sjd/bench/bookkeeping.py.
Prints ratios measured in this run; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from sjd.bench.bookkeeping import measure
from sjd.harness.provenance import git_hash
from sjd.harness.results import markdown_table


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="standin_lumina_512", help="a conf/model/ config")
    ap.add_argument("--prompts", type=int, default=2, help="batches of each size that every decoder decodes")
    ap.add_argument("--windows", type=ints, default=[16, 64])
    ap.add_argument("--batches", type=ints, default=[1, 8])
    ap.add_argument("--decoders", type=lambda s: s.split(","), default=None, help="conf/decoder/ names (default all)")
    ap.add_argument("--wall", action="store_true", help="wall-clock time instead of the thread's CPU time")
    ap.add_argument("--out", type=Path, help="write the table to this CSV")
    args = ap.parse_args()
    clock = "wall" if args.wall else "CPU time of one thread"
    print(f"torch {torch.__version__}, {args.model}, {args.prompts} batch(es) per size, {clock}")
    table = measure(args.model, args.decoders, args.windows, args.batches, args.prompts, cpu_time=not args.wall)
    print("\n## Bookkeeping per iteration (ms), ratio to SJD at the same window and batch\n")
    print(markdown_table(table, floatfmt=".3f"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        command = shlex.join(["python", "scripts/bench_bookkeeping.py", *sys.argv[1:]])
        provenance = {"model": args.model, "clock": clock, "command": command, "git_hash": git_hash(),
                      "torch": torch.__version__}  # fmt: skip
        table.assign(**provenance).to_csv(args.out, index=False)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
