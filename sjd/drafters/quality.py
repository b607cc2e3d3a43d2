"""How much a drafter would accept, measured in seconds instead of a decoding run's minutes.

On images the drafter never trained on, teacher-forced (every pair holds the target's own feature f_j): at each
free generated position, q is the drafter's prediction through the target's head and the shared logits pipeline
(CFG over both rows, grammar, temperature, top-k / top-p), as at decoding, and p the target's. EAGLE-2's rule
accepts one of a node's deterministic children with probability p(children), so

- `accept_k`: the mean of p(top-k ids of q): the acceptance at a tree's first level with k children (k = 1: a
  chain's; k = 10: EAGLE-2's default top_k);
- `ceiling_k`: the mean of p(top-k ids of p): what a perfect drafter gets there, a property of the target alone;
- `overlap`: the mean of sum_x min(p(x), q(x)) = 1 - TV(p, q): the acceptance of one child drawn from q and
  tested by speculative sampling (EAGLE-1's rule, `eagle_sampled`), whose ceiling is 1 whatever p's entropy.

Deeper levels read the drafter's own predicted features and accept less; a decoding run (decoder=eagle) measures
the whole tree. The ceiling says how much any drafter can gain on a target: little on a high-entropy one.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from sjd.core.sampling import SamplingConfig, logits_to_probs
from sjd.drafters.data import DrafterData
from sjd.drafters.net import DrafterNet
from sjd.drafters.training import TrainSettings, collate, drafter_forward
from sjd.models.base import ModelAdapter
from sjd.types import Logits


@torch.no_grad()
def first_level_acceptance(
    net: DrafterNet, head, adapter: ModelAdapter, data: DrafterData, sampling: SamplingConfig, ks=(1, 10)
) -> dict:
    """{"accept_k", "ceiling_k" for k in `ks`, "overlap", "positions"} over the free generated positions of
    `data`'s images (module docstring); `head` maps hidden states [M, H] to raw logits [M, V]
    (sjd.drafters.training.target_head)."""
    layout = adapter.layout
    quiet = replace(TrainSettings(), noise_std=0.0)
    device = next(net.parameters()).device
    net.eval()
    sums = {f"{what}_{k}": 0.0 for k in ks for what in ("accept", "ceiling")} | {"overlap": 0.0}
    count = 0
    for rows in data.images:
        batch = collate(rows, 0, quiet, device)
        pred = drafter_forward(net, batch)
        # each row's learnt pairs predict generated positions 1 .. N-1, in order
        q_rows = [head(pred[r][batch.learn[r]]) for r in range(len(rows))]
        p_rows = [head(batch.targets[r][batch.learn[r]]) for r in range(len(rows))]
        positions = torch.arange(1, layout.n_tokens, device=device)[None]
        q = logits_to_probs(_logits(q_rows), positions, layout, sampling)[0]
        p = logits_to_probs(_logits(p_rows), positions, layout, sampling)[0]
        free = (layout.forced[1:] < 0).to(device)
        q, p = q[free], p[free]
        for k in ks:
            sums[f"accept_{k}"] += float(p.gather(1, q.topk(k, -1).indices).sum())
            sums[f"ceiling_{k}"] += float(p.topk(k, -1).values.sum())
        sums["overlap"] += float(torch.minimum(p, q).sum())
        count += len(p)
    return {**{key: total / max(count, 1) for key, total in sums.items()}, "positions": count}


def _logits(rows: list[torch.Tensor]) -> Logits:
    return Logits(rows[0][None], rows[1][None] if len(rows) > 1 else None)
