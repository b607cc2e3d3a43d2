"""How hard the toy model is for a decoder, and how well it follows captions.

    python scripts/toy_report.py [--n 32]

Samples the toy prompt set with AR under the default sampling settings (conf/model/toy.yaml),
then reports, as one JSON line:
- mean_entropy_nats: mean entropy of the processed (CFG, grammar, temperature) distribution at
  free image-code positions, teacher-forced on the samples - what a draft has to guess;
- background_accuracy / object_accuracy: how often the dominant colour measured from the
  pixels matches the caption's background / first object colour (single-object prompts).
"""

from __future__ import annotations

import argparse
import json

import torch
from omegaconf import OmegaConf

from sjd.core.sampling import SamplingConfig, entropy, logits_to_probs
from sjd.decoders.ar import ARDecoder
from sjd.harness.prompts import PROJECT_ROOT, load_prompt_file
from sjd.harness.provenance import make_generators
from sjd.models.toy import ToyAdapter
from sjd.toy.tokenizer import dominant_colours


def teacher_forced_entropy(adapter: ToyAdapter, prompts, tokens: torch.Tensor, sampling: SamplingConfig) -> float:
    """Mean entropy of the pipeline's distribution at each free position of `tokens`."""
    layout = adapter.layout
    first = adapter.prefill(prompts, sampling.uses_uncond)
    rest = adapter.forward(tokens[:, :-1], [0] * len(prompts))
    cond = torch.cat([first.cond, rest.cond], dim=1)
    uncond = None if first.uncond is None else torch.cat([first.uncond, rest.uncond], dim=1)
    positions = torch.arange(layout.n_tokens).expand(len(prompts), -1)
    probs = logits_to_probs(type(first)(cond, uncond), positions, layout, sampling)
    free = layout.forced < 0
    return float(entropy(probs)[:, free].mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sampling = SamplingConfig(**OmegaConf.load(PROJECT_ROOT / "conf" / "model" / "toy.yaml").sampling)
    adapter = ToyAdapter()
    prompts = load_prompt_file(PROJECT_ROOT / "sjd" / "assets" / "prompts" / "toy.tsv")[: args.n]
    gens = make_generators(args.seed, [p.prompt_id for p in prompts], adapter.device)
    tokens = ARDecoder().generate(adapter, prompts, sampling, gens).tokens
    with torch.no_grad():
        ent = teacher_forced_entropy(adapter, prompts, tokens, sampling)
    images = adapter.decode_images(tokens)
    bg = obj = singles = 0
    for prompt, img in zip(prompts, images):
        words, colours = prompt.text.split(), dominant_colours(img)
        bg += colours[0] == words[-1]
        if " and " not in prompt.text:
            singles += 1
            obj += len(colours) > 1 and colours[1] == words[1]
    report = {
        "n_prompts": len(prompts),
        "sampling": sampling.__dict__,
        "mean_entropy_nats": round(ent, 4),
        "background_accuracy": round(bg / len(prompts), 3),
        "object_accuracy_single_object_prompts": round(obj / max(singles, 1), 3),
        "n_single_object_prompts": singles,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
