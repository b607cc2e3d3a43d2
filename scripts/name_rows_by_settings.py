"""Rename results rows whose decoder ran under a name that now means another config, to the name its overlay gives
that config today (studies/row_names.py: the rules, and every column that records the name).

    python scripts/name_rows_by_settings.py [--check] [CSV ...]   # default: results/studies/*.csv

Only names change; every number stays in its row. `--check` lists what would change and exits 1 if anything
would (tests/project/test_decoder_names.py holds the committed CSVs to it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from studies.row_names import STUDY_CSVS, rename_files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csvs", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true", help="list what would change; exit 1 if anything would")
    args = parser.parse_args()
    pending = rename_files(args.csvs or sorted(STUDY_CSVS.glob("*.csv")), write=not args.check)
    if args.check and pending:
        sys.exit(1)


if __name__ == "__main__":
    main()
