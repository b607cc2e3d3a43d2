"""Host syncs and operator calls per decoder iteration, counted on the CPU (sjd/bench/syncs.py).

    python scripts/count_syncs.py [--model toy] [--decoders ar,sjd,...] [--windows 16,64] [--batches 1,8]
                                  [--caches dynamic,static] [--kernels eager,compiled] [--out results/syncs.csv]
    python scripts/count_syncs.py --forward-ops --model standin_lumina_768_cal

For every decoder of conf/decoder/ (or `--decoders`) on each KV cache at each window and batch size, one decode
of the model's first prompts under a SyncCounter: syncs per iteration in the decoder, in the logits pipeline and
in the model forward, the decoder's sync sites with what each is for, and operator calls outside the forward (kernel
launches on a GPU). `--kernels compiled` counts them as compile=true launches them, on the static cache it
compiles on: each call of the pipeline, verification or sampling one CUDA graph replay (sjd.decoders.kernels).
Counts, not times: the same on any machine for the same code and seeds. Writes the table with its provenance
(model, command, git hash, torch) to `--out` when given. A decoder's own networks (a drafter) count as
forwards, not as its calls (sjd.bench.syncs.count_decode).

`--forward-ops` prints instead the operator calls of one width-1 forward of the model, outside its layers and per
layer: the eager forward's launches that sjd.core.cost prices (FORWARD_OPS_FIXED, FORWARD_OPS_PER_LAYER).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from sjd.bench.sync_table import SHOWN, forward_ops_line, merged_into, sync_table
from sjd.harness.provenance import git_hash
from sjd.harness.results import markdown_table


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="toy", help="a conf/model/ config")
    ap.add_argument("--decoders", default=None, help="comma-separated conf/decoder/ names (default: every one)")
    ap.add_argument("--windows", type=ints, default=[16, 64])
    ap.add_argument("--batches", type=ints, default=[1, 8])
    ap.add_argument("--caches", default="dynamic,static", help="KV caches to count on (run.py's cache)")
    ap.add_argument("--kernels", default="eager", help="eager, compiled (static cache only) or both")
    ap.add_argument("--out", type=Path, default=None, help="write the table here (results/syncs.csv is ours)")
    ap.add_argument("--merge", action="store_true", help="add the rows to --out, replacing those with the same key")
    ap.add_argument("--forward-ops", action="store_true", help="count one forward's operator calls instead")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.forward_ops:
        print(forward_ops_line(args.model))
        return
    names = args.decoders.split(",") if args.decoders else None
    table = sync_table(args.model, names, args.windows, args.batches, args.caches.split(","), args.kernels.split(","))
    table = table.assign(command=shlex.join(["python", *sys.argv]), git_hash=git_hash(), torch=torch.__version__)
    print(markdown_table(table[SHOWN].round(2)))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        (merged_into(table, args.out) if args.merge else table).to_csv(args.out, index=False)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
