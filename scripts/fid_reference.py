"""Compute FID reference statistics once from real images, for `eval.fid.reference`.

    python scripts/fid_reference.py --images /data/coco/val2017 --extractor inception \
        --inception-weights weights-inception-2015-12-05-6726825d.pth --protocol sjd --out refs/coco_val2017_sjd.npz
    python scripts/fid_reference.py --toy 2000 --protocol sjd --out refs/toy_heldout.npz

Images are read with PIL (RGB), pre-processed by the protocol (sjd: resize 299; clean: centre
crop, resize 256), encoded by the feature network, and stored as feature sums (.npz) with a
JSON note of the source folder, image count, extractor and protocol.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from sjd.eval.fid import add_images, build_metric, save_reference, toy_reference_images

EXTENSIONS = {".jpg", ".jpeg", ".png", ".webp"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", type=Path, help="a folder of real images")
    src.add_argument("--toy", type=int, help="this many held-out real toy images")
    ap.add_argument("--extractor", default="toy", choices=["toy", "inception"])
    ap.add_argument("--weights", default=None, help="toy CLIP directory (extractor toy)")
    ap.add_argument("--inception-weights", default=None)
    ap.add_argument(
        "--any-inception",
        action="store_true",
        help="accept Inception weights that are not the reference file (their FID does not compare with papers')",
    )
    ap.add_argument("--protocol", default="sjd", choices=["sjd", "clean"])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    metric = build_metric(args.extractor, args.weights, args.inception_weights, not args.any_inception)
    if args.images:
        files = sorted(p for p in args.images.iterdir() if p.suffix.lower() in EXTENSIONS)
        if not files:
            raise SystemExit(f"{args.images}: no images ({', '.join(sorted(EXTENSIONS))})")
        for f in files:  # one at a time: real images come in mixed sizes
            add_images(metric, np.asarray(Image.open(f).convert("RGB"))[None], args.protocol, real=True)
        source = {"source": str(args.images), "n": len(files)}
    else:
        add_images(metric, toy_reference_images(args.toy), args.protocol, real=True)
        source = {"source": "toy held-out scenes", "n": args.toy}
    save_reference(metric, args.out, {**source, "extractor": args.extractor, "protocol": args.protocol})
    print(f"wrote {args.out} ({source['n']} images, {args.extractor}, protocol {args.protocol})")


if __name__ == "__main__":
    main()
