"""Throughput of AR and SJD on the toy model at batch sizes 1, 4 and 16, from one run.

    python scripts/bench_throughput.py [--prompts 16] [--window 16]

For each batch size, both decoders decode the same prompts (alternating which goes first per
batch); prints images per second and wall time per image, and SJD's ratios to AR at that batch
size. Rows of a batch commit different numbers of tokens (per-row caches), so a batch runs until
its slowest row is done.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from sjd.core.sampling import SamplingConfig
from sjd.decoders.ar import ARDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.prompts import load_prompt_file
from sjd.harness.provenance import make_generators
from sjd.harness.results import markdown_table
from sjd.models.toy import ToyAdapter

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--window", type=int, default=16)
    args = ap.parse_args()
    toy, sampling = ToyAdapter(), SamplingConfig(cfg_scale=3.0)
    prompts = load_prompt_file(ROOT / "sjd" / "assets" / "prompts" / "toy.tsv")[: args.prompts]
    decoders = [ARDecoder(), SJDDecoder(window=args.window)]
    for d in decoders:  # warm-up
        d.generate(toy, prompts[:2], sampling, make_generators(0, [p.prompt_id for p in prompts[:2]], toy.device))
    rows = []
    for batch in (1, 4, 16):
        wall = {d.name: 0.0 for d in decoders}
        for i in range(0, len(prompts), batch):
            group = prompts[i : i + batch]
            for d in decoders if (i // batch) % 2 == 0 else decoders[::-1]:
                t0 = time.perf_counter()
                d.generate(toy, group, sampling, make_generators(0, [p.prompt_id for p in group], toy.device))
                wall[d.name] += time.perf_counter() - t0
        for d in decoders:
            rows.append({"batch_size": batch, "decoder": d.name, "images_per_s": len(prompts) / wall[d.name],
                         "s_per_image": wall[d.name] / len(prompts),
                         "throughput_vs_ar": wall["ar"] / wall[d.name]})  # fmt: skip
    table = pd.DataFrame(rows)
    print(f"toy model, {len(prompts)} prompts, SJD window {args.window}, CFG 3, temperature 1, CPU")
    print(markdown_table(table))


if __name__ == "__main__":
    main()
