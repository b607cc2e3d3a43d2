"""Is our AR baseline honest? Our AR decoder against transformers' own `generate` on the toy model.

    python scripts/bench_ar_vs_generate.py [--prompts 16] [--repeats 3]

Both decode greedily with the same batched CFG (conditional and unconditional rows in one batch,
guided logits `uncond + s * (cond - uncond)`) and the same grammar (forced begin/end-of-image and
end-of-line tokens, image codes elsewhere): `generate` gets them as a LogitsProcessor that writes
the guided, grammar-masked scores into both rows of a pair, so both rows pick the same token.
The script checks that the two produce the same tokens, then times them prompt by prompt,
alternating which goes first, and prints our latency over theirs (below 1.0: ours is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

import sjd  # noqa: F401  (first: it mends torchvision's import on the CPU torch, which transformers triggers)

# isort: split
from transformers import LogitsProcessor, LogitsProcessorList

from sjd.core.sampling import SamplingConfig, cfg_mix, grammar_mask
from sjd.decoders.ar import ARDecoder
from sjd.harness.prompts import load_prompt_file
from sjd.harness.provenance import make_generators
from sjd.models.toy import ToyAdapter
from sjd.types import Logits

ROOT = Path(__file__).resolve().parents[1]


class BatchedCFG(LogitsProcessor):
    """Rows [cond..., uncond...]: both rows of a pair get the guided, grammar-masked scores."""

    def __init__(self, scale: float, layout, prompt_len: int) -> None:
        self.scale, self.layout, self.prompt_len = scale, layout, prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        cond, uncond = scores.float().chunk(2)
        guided = cfg_mix(Logits(cond[:, None], uncond[:, None]), self.scale)
        pos = torch.full((cond.shape[0], 1), input_ids.shape[1] - self.prompt_len)
        guided = guided.masked_fill(~grammar_mask(pos, self.layout), float("-inf"))[:, 0]
        return torch.cat([guided, guided])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    toy = ToyAdapter()
    sampling = SamplingConfig(cfg_scale=3.0, temperature=0.0)
    prompts = load_prompt_file(ROOT / "sjd" / "assets" / "prompts" / "toy.tsv")[: args.prompts]
    n = toy.layout.n_tokens

    def ours(p):
        return ARDecoder().generate(toy, [p], sampling, make_generators(0, [p.prompt_id], toy.device)).tokens[0]

    def theirs(p):
        ids = toy.prompt_ids([p], with_uncond=True)
        proc = LogitsProcessorList([BatchedCFG(sampling.cfg_scale, toy.layout, ids.shape[1])])
        out = toy.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 min_new_tokens=n, do_sample=False, logits_processor=proc, pad_token_id=0,
                                 eos_token_id=None)  # fmt: skip
        return out[0, ids.shape[1] :]

    for p in prompts[:2]:  # warm-up, and the equality check
        assert torch.equal(ours(p), theirs(p)), f"tokens differ for {p.prompt_id}"
    times = {"ours": [], "generate": []}
    for r in range(args.repeats):
        for i, p in enumerate(prompts):
            order = [("ours", ours), ("generate", theirs)]
            for name, fn in order if (i + r) % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                fn(p)
                times[name].append(time.perf_counter() - t0)
    a, b = statistics.mean(times["ours"]), statistics.mean(times["generate"])
    print(f"toy, greedy, batched CFG, {len(prompts)} prompts x {args.repeats}: same tokens on the checked prompts")
    print(f"our AR {a:.3f} s/image, transformers generate {b:.3f} s/image, ours / theirs = {a / b:.3f}")


if __name__ == "__main__":
    main()
