"""Train a stand-in Lumina-mGPT on procedural images and write its checkpoint under sjd/assets (sjd.standin.build).

    python scripts/train_standin.py standin_lumina_512    # rebuild one shipped stand-in (STANDINS)
    python scripts/train_standin.py all                   # rebuild every one
    python scripts/train_standin.py prompts               # rewrite sjd/assets/prompts/standin.tsv
    python scripts/train_standin.py --custom x --noise 0.02 --steps 5 --out /tmp/x   # a new one, or a smoke run
    python scripts/train_standin.py --check-recipe standin_llamagen_512   # is the checkpoint this recipe's?
    python scripts/train_standin.py --check standin_llamagen_512          # does it retrain bit for bit?

A build is a pure function of its arguments and thread count. The checkpoint's record keeps every argument, the
final loss, the training time and three hashes: of the weights, of the arguments, and a fingerprint of the weights
after the first training steps. `--check-recipe` recomputes all three in seconds (the fingerprint survives another
CPU's rounding); `--check` retrains in full and compares every tensor bit for bit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sjd.standin.build import PASSED, PROMPTS, build, check_recipe, check_retrain, write_prompts
from sjd.standin.recipes import ASSETS, DEFAULTS, STANDINS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"shipped stand-ins to rebuild ({', '.join(STANDINS)}), or all")
    ap.add_argument("--custom", help="train a stand-in of this name from the options below instead")
    for key, value in DEFAULTS.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value)
    ap.add_argument("--out", type=Path, help="default sjd/assets/<name>")
    ap.add_argument("--check-recipe", metavar="NAME_OR_DIR", help="check a checkpoint's hashes against the recipe")
    ap.add_argument("--check", metavar="NAME_OR_DIR", help="retrain a checkpoint and compare it bit for bit")
    args = ap.parse_args()
    for target, check in ((args.check_recipe, check_recipe), (args.check, check_retrain)):
        if target is None:
            continue
        problems = check(target)
        print("\n".join(problems) if problems else f"{target}: {PASSED[check]}")
        sys.exit(1 if problems else 0)
    if args.custom:
        build(args.custom, {k: getattr(args, k) for k in DEFAULTS}, args.out or ASSETS / args.custom)
        return
    if args.names == ["prompts"]:
        write_prompts(PROMPTS)
        return
    names = list(STANDINS) if args.names == ["all"] else args.names
    unknown = [n for n in names if n not in STANDINS]
    if unknown or not names:
        ap.error(f"unknown stand-in(s) {unknown}; one of {list(STANDINS)} or all" if unknown else "name a stand-in")
    for name in names:
        build(name, STANDINS[name], args.out or ASSETS / name)


if __name__ == "__main__":
    main()
