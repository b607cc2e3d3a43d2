"""Why branch drafting does not pay on the toy model: step compression over several seeds.

    python scripts/branch_study.py [--prompts 32] [--seeds 4] [--window 64]

Counts forwards only (no timing), so it can run next to other work. Rows:
- csjd, and csjd_tree at branch depth 1 and 3 (4 candidates per branching position);
- csjd_tree depth 3 with its siblings in the window but never accepted: the cost of the chain
  slots they take, on its own;
- for csjd: the share of forwards that commit one token and the share of tokens committed by
  forwards that commit more than 40 (the toy's accepted lengths are bimodal);
- how often a sibling was committed;
- where the forwards go: forwards per image row for csjd, and for csjd starting with one AR
  token and horizontal drafts (the first row's cold start).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

import sjd.decoders.tree as tree
from sjd.decoders.coupled import CoupledSJDDecoder
from sjd.harness.toy_study import ToyStudy

ROOT = Path(__file__).resolve().parents[1]


class SiblingsNeverAccepted(tree.BranchingSJDDecoder):
    """Siblings occupy their window slots but are never tried: isolates the slots' cost."""

    def verify_and_commit(self, state, cached, branch_commits, win, p, widths, generators):
        win.has_sibling = torch.zeros_like(win.has_sibling)
        super().verify_and_commit(state, cached, branch_commits, win, p, widths, generators)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--window", type=int, default=64)
    args = ap.parse_args()
    study = ToyStudy.load(args.prompts)
    W = args.window
    decoders = [
        ("csjd", CoupledSJDDecoder(window=W)),
        ("csjd_tree depth 1", tree.BranchingSJDDecoder(window=W, branches=4, branch_depth=1)),
        ("csjd_tree depth 3", tree.BranchingSJDDecoder(window=W, branches=4, branch_depth=3)),
        ("csjd_tree depth 3, siblings never accepted", SiblingsNeverAccepted(window=W, branches=4, branch_depth=3)),
        ("csjd_tree, no branching (branches=1)", tree.BranchingSJDDecoder(window=W, branches=1, branch_depth=0)),
    ]
    print(f"toy model, {len(study.prompts)} prompts x {args.seeds} seeds, window {W}: step compression per seed, mean")
    for label, decoder in decoders:
        per_seed, takes, siblings = [], [], 0
        for result in study.runs(decoder, args.seeds):
            per_seed.append(study.step_compression(result))
            takes += [t for accepted in result.accepted for t in accepted[1:]]
            siblings += sum(result.extras.get("branch_commits", [0]))
        one = sum(t == 1 for t in takes) / len(takes)
        long_share = sum(t for t in takes if t > 40) / sum(takes)
        print(
            f"{label}: {', '.join(f'{x:.2f}' for x in per_seed)}; mean {statistics.mean(per_seed):.2f}; "
            f"forwards committing 1 token {one:.0%}, tokens from forwards committing > 40: {long_share:.0%}; "
            f"sibling commits {siblings}"
        )
    layout = study.adapter.layout
    for label, decoder in (
        ("csjd", CoupledSJDDecoder(window=W)),
        ("csjd, one AR token first, horizontal drafts", CoupledSJDDecoder(window=W, init="horizontal", ar_prefix=2)),
    ):
        per_row = [0] * layout.height
        for result in study.runs(decoder, args.seeds):
            for accepted in result.accepted:
                position = 0
                for take in accepted:  # a forward counts for the image row its first new token falls in
                    per_row[min(max(position - layout.first_code, 0) // layout.row_stride, layout.height - 1)] += 1
                    position += take
        runs = args.seeds * len(study.prompts)
        print(f"{label}: forwards per image row (top first): {', '.join(f'{n / runs:.1f}' for n in per_row)}")


if __name__ == "__main__":
    main()
