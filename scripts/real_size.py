"""Do the real shapes fit and run? Each 7B-class architecture at its real size, bf16, random weights, on this CPU
(sjd/bench/real_size.py says what it builds, decodes and records).

    python scripts/real_size.py [--models lumina,janus,emu3] [--windows 3] [--out results/real_size.csv]
    python scripts/real_size.py --tiny --models lumina --out /tmp/real_size_tiny.csv   # the same code, tiny widths

A study of memory and shapes, not of speed or acceptance (random weights accept nothing meaningful). Each model is
built and decodes its prefill and first `--windows` SJD windows in a child process of its own, so that its peak
memory is its own; one CSV row per (model, forward), or one row with the error of a model that fails.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sjd.bench.real_size import DEFAULT_MODELS, MODELS, default_out, real_size


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated subset of {MODELS}")
    ap.add_argument("--windows", type=int, default=3, help="SJD windows after the prefill")
    ap.add_argument("--tiny", action="store_true", help="tiny widths and depths, real vocabularies and layouts")
    ap.add_argument("--threads", type=int, help="torch threads per child (default: torch's)")
    ap.add_argument("--out", type=Path, help="CSV (default results/real_size.csv; tiny: /tmp/real_size_tiny.csv)")
    args = ap.parse_args(argv)
    if args.windows < 1:
        ap.error("--windows must be >= 1")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        ap.error(f"--models: unknown {unknown}; choose from {','.join(MODELS)}")
    command = shlex.join(["python", *sys.argv])
    real_size(models, args.windows, args.tiny, args.threads, args.out or default_out(args.tiny), command)


if __name__ == "__main__":
    main()
