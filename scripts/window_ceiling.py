"""How far a wider window takes coupled Jacobi decoding on the toy model.

    python scripts/window_ceiling.py [--prompts 32] [--seeds 4] [--windows 16 64 158]

Step compression (generated tokens per forward, prefill counted) of SJD, `csjd` (maximal
coupling) and `csjd_gumbel`, per seed and mean, at each window; the last default window holds
the whole 158-token image, so nothing is ever cut off by the window. If even that stays far
below 2x SJD's step compression at window 64, the limit is the image's sequential dependency
(a draft is only accepted once the tokens before it are right), not the window. Counts forwards
only (no timing), so it can run next to other work.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from sjd.decoders.coupled import CoupledSJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.toy_study import ToyStudy

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--windows", type=int, nargs="+", default=[16, 64, 158])
    args = ap.parse_args()
    study = ToyStudy.load(args.prompts)
    print(
        f"toy model ({study.n_tokens} tokens an image), {len(study.prompts)} prompts x {args.seeds} seeds: "
        "step compression"
    )
    means: dict[tuple[int, str], float] = {}
    for window in args.windows:
        for label, decoder in (
            ("sjd", SJDDecoder(window=window)),
            ("csjd", CoupledSJDDecoder(window=window)),
            ("csjd_gumbel", CoupledSJDDecoder(window=window, coupling="gumbel")),
        ):
            per_seed = [study.step_compression(result) for result in study.runs(decoder, args.seeds)]
            means[window, label] = statistics.mean(per_seed)
            print(
                f"window {window:>3} {label:<12} {', '.join(f'{x:.2f}' for x in per_seed)}; "
                f"mean {means[window, label]:.2f}; {means[window, label] / means[window, 'sjd']:.2f}x SJD at this "
                "window",
                flush=True,
            )
    widest = max(args.windows)
    for window in args.windows:
        best = max(means[widest, "csjd"], means[widest, "csjd_gumbel"])
        print(
            f"best coupled decoder with window {widest}: {best / means[window, 'sjd']:.2f}x SJD's step compression "
            f"at window {window}"
        )


if __name__ == "__main__":
    main()
