"""The negative controls of the exactness audits: `python scripts/audit_controls.py [--images N]`.

Draws N images of the micro model with each deliberately faulty decoder (sjd/audit/controls.py), runs
the one-sample teacher-forced audit and the two-sample per-position test on them, and writes
results/audit_controls.csv; `scripts/results_pages.py` renders it as docs/audit_controls.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sjd.audit.controls import measure_controls

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "audit_controls.csv")
    args = ap.parse_args()
    table = measure_controls(args.images, args.seed)
    table.to_csv(args.out, index=False, float_format="%.6g")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
