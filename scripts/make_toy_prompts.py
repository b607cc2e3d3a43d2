"""Write the toy prompt set (captions of held-out scenes) to sjd/assets/prompts/toy.tsv.

    python scripts/make_toy_prompts.py

The scenes come from a seed the training script never uses, so prompts are held out. The
file also records each scene's background and first object, which the learning test reads.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from sjd.toy.scenes import sample_scene

OUT = Path(__file__).resolve().parents[1] / "sjd" / "assets" / "prompts" / "toy.tsv"
PROMPT_SEED = 20261129  # never a training seed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rng = np.random.Generator(np.random.PCG64(PROMPT_SEED))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["id", "Prompt", "background", "n_objects"])
        for i in range(args.n):
            # Every fourth scene has a single object: the clearest test of caption following.
            scene = sample_scene(rng, n_objects=1 if i % 4 == 0 else None)
            w.writerow([f"toy{i:03d}", scene.caption, scene.background, len(scene.objects)])
    print(f"wrote {args.n} prompts to {args.out}")


if __name__ == "__main__":
    main()
