"""How far a stand-in's predictions reach back: the distance its next-code distributions move when one earlier
code changes, by how many codes back that code is (sjd.standin.dependence).

    python scripts/standin_dependence.py standin_lumina_512 standin_llamagen_512 [/path/to/checkpoint ...]
                                         [--changes 6] [--images 4] [--offsets 1,2,4,8,16,32,33,64]

For each stand-in (a shipped name or a checkpoint directory) it prints one row: the mean total-variation distance
between a code's distributions before and after the code `d` back is redrawn, at each offset d (in codes, raster
order; a row is 32 codes at 512 px). Prints what it measured; asserts nothing.
"""

from __future__ import annotations

import argparse

from sjd.standin.dependence import print_profiles


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("standins", nargs="+", help="shipped stand-in names or checkpoint directories")
    ap.add_argument("--changes", type=int, default=6, help="positions changed, one at a time")
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--offsets", default="1,2,3,4,8,16,31,32,33,64")
    args = ap.parse_args()
    print_profiles(args.standins, args.changes, args.images, [int(x) for x in args.offsets.split(",")])


if __name__ == "__main__":
    main()
