"""Render the results pages docs/results/<page>.md from the study CSVs results/studies/<page>.csv,
their index docs/results/README.md, and README.md's headline table (studies).

    python scripts/results_pages.py [--results results/studies] [--conf conf/experiment] [--out docs/results]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import studies

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "studies")
    ap.add_argument("--conf", type=Path, default=ROOT / "conf" / "experiment")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md", help="README whose headline block to fill")
    args = ap.parse_args()
    for path in studies.render_all(args.results, args.conf, args.out, ROOT / "results"):
        print(path)
    args.readme.write_text(studies.with_headline(args.readme.read_text(), studies.render_headline(args.results)))
    print(args.readme)


if __name__ == "__main__":
    main()
