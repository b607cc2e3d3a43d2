"""How often a carried draft changes from one iteration to the next (SCD's diagnosis of SJD).

    python scripts/draft_churn.py [--prompts 8] [--window 16]

For SJD and the two couplings (random init, toy model, same prompts and seeds), counts the
draft slots that carry over past the commit and the share whose new draft differs from the
draft the slot held in this iteration. SCD reports ~94% for SJD on Lumina-mGPT.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from sjd.core.sampling import SamplingConfig
from sjd.decoders.coupled import CoupledSJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.prompts import load_prompt_file
from sjd.harness.provenance import make_generators
from sjd.models.toy import ToyAdapter


def churn(decoder: SJDDecoder, adapter: ToyAdapter, prompts, sampling: SamplingConfig) -> tuple[int, int]:
    """(changed, carried) draft slots over one generate() call."""
    counts = [0, 0]
    next_drafts = decoder.next_drafts

    def counted(p, drafts, q, n_drafts, result, uniforms, positions, state):
        samples, samples_q = next_drafts(p, drafts, q, n_drafts, result, uniforms, positions, state)
        slot = torch.arange(drafts.shape[1], device=p.device)[None]
        carried = (slot > result.n_accepted[:, None]) & (slot < n_drafts[:, None])
        counts[0] += int((carried & (samples[:, : drafts.shape[1]] != drafts)).sum())
        counts[1] += int(carried.sum())
        return samples, samples_q

    decoder.next_drafts = counted
    decoder.generate(adapter, prompts, sampling, make_generators(0, [p.prompt_id for p in prompts], adapter.device))
    return counts[0], counts[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--window", type=int, default=16)
    args = ap.parse_args()
    adapter = ToyAdapter()
    prompts = load_prompt_file(Path(__file__).resolve().parents[1] / "sjd/assets/prompts/toy.tsv")[: args.prompts]
    sampling = SamplingConfig(cfg_scale=3.0)
    for decoder in (
        SJDDecoder(window=args.window),
        CoupledSJDDecoder(name="scd_gumbel", window=args.window, init="random", coupling="gumbel"),
        CoupledSJDDecoder(name="scd_maximal", window=args.window, init="random", coupling="maximal"),
    ):
        changed, carried = churn(decoder, adapter, prompts, sampling)
        print(f"{decoder.name}: {changed} of {carried} carried drafts changed ({changed / carried:.1%})")


if __name__ == "__main__":
    main()
