"""Token against block verification in SJD on the toy model: does block verification commit more
tokens per forward, losslessly?

    python scripts/verification_study.py [--prompts 32] [--seeds 4] [--windows 16 64]

Step compression (generated tokens per forward, prefill counted), per seed and mean, of SJD with the
paper's token-by-token test and with block verification (sjd.core.verify.block_verify), for random and
`vertical_dist` fresh drafts, next to the coupled decoders `csjd` and `csjd_gumbel`. Block
verification needs fresh next drafts, so it cannot be stacked on a coupling; this shows what each
buys. Counts forwards only (no timing), so it can run next to other work.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from sjd.decoders.coupled import CoupledSJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.toy_study import ToyStudy

ROOT = Path(__file__).resolve().parents[1]


def decoders(window: int) -> dict[str, SJDDecoder]:
    return {
        "sjd": SJDDecoder(window=window),
        "sjd_block": SJDDecoder(window=window, verification="block"),
        "sjd_vertical_dist": SJDDecoder(window=window, init="vertical_dist"),
        "sjd_vertical_dist_block": SJDDecoder(window=window, init="vertical_dist", verification="block"),
        "csjd": CoupledSJDDecoder(window=window),
        "csjd_gumbel": CoupledSJDDecoder(window=window, coupling="gumbel"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--windows", type=int, nargs="+", default=[16, 64])
    args = ap.parse_args()
    study = ToyStudy.load(args.prompts)
    print(
        f"toy model ({study.n_tokens} tokens an image), {len(study.prompts)} prompts x {args.seeds} seeds: "
        "step compression"
    )
    for window in args.windows:
        means: dict[str, float] = {}
        for label, decoder in decoders(window).items():
            per_seed = [study.step_compression(result) for result in study.runs(decoder, args.seeds)]
            means[label] = statistics.mean(per_seed)
            print(
                f"window {window:>3} {label:<24} {', '.join(f'{x:.2f}' for x in per_seed)}; "
                f"mean {means[label]:.2f}; {means[label] / means['sjd']:.2f}x SJD",
                flush=True,
            )
        for init in ("sjd", "sjd_vertical_dist"):
            gain = means[init + "_block"] / means[init]
            print(f"window {window:>3} block against token verification, {init}: {gain:.3f}x")


if __name__ == "__main__":
    main()
