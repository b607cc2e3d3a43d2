"""Whether a prompt decodes to the same tokens alone as in a batch, on a model at its own size
(`scripts/batch_invariance.py` is its command line:
`python scripts/batch_invariance.py MODEL DECODER [--prompts 4] [--seed 0] [--float64] [--check]`).

MODEL and DECODER name a config of conf/model and of conf/decoder (the model's sampling settings,
the decoder's own config). The first `--prompts` prompts of the model's prompt set (`standin` for the
stand-ins, `toy` otherwise, as the bookkeeping bench takes them) are decoded together, then each alone, with
the seeds a run gives them; each line says whether the two agree and, where not, the first token where they
part and the forwards each took.

Every row keeps its own cache length and its own generator (docs/design.md §3), so in exact arithmetic a row's
trajectory does not depend on its batch; the decoder tests hold that bitwise on the tiny models. A batched
kernel may round differently from the same kernel over one row, though, and at a real size such a last-bit
difference now and then moves a draw or an acceptance test across its boundary, after which the two
trajectories part: the same distribution, another sample. `--float64` runs the networks in double precision,
where those roundings are too small to move a draw; a trajectory that still parts there points at the batching
itself. `--check` exits 1 when any prompt differs.
"""

from __future__ import annotations

import argparse

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from sjd.bench.bookkeeping import model_config, prompt_batches
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import sample_generators
from sjd.harness.decoder_configs import decoder_config


def compare(model: str, decoder: str, n_prompts: int, seed: int, float64: bool) -> list[dict]:
    """One dict per prompt: its id, whether alone and in the batch agree, the first differing token (or -1) and
    the forwards each took."""
    run = OmegaConf.create({"decoder": decoder_config(decoder), "model": model_config(model)})
    resolved = OmegaConf.create(OmegaConf.to_container(run, resolve=True))
    adapter = instantiate(resolved.model.adapter, device="cpu")
    if float64:
        for net in adapter.networks().values():
            net.double()
    dec = instantiate(resolved.decoder)
    dec.check(adapter)
    sampling = SamplingConfig(**OmegaConf.to_container(resolved.model.sampling))
    prompts = [p for p, _ in prompt_batches(model, 1, n_prompts)[0]]  # the bookkeeping bench's prompts, seed index 0

    def generators(ps):
        return sample_generators(seed, [(p.prompt_id, 0) for p in ps], torch.device("cpu"))

    together = dec.generate(adapter, prompts, sampling, generators(prompts))
    out = []
    for i, prompt in enumerate(prompts):
        alone = dec.generate(adapter, [prompt], sampling, generators([prompt]))
        a, b = alone.tokens[0], together.tokens[i]
        differ = (a != b).nonzero()
        out.append({
            "prompt": prompt.prompt_id,
            "equal": not len(differ),
            "first_difference": int(differ[0]) if len(differ) else -1,
            "n_tokens": len(a),
            "forwards_alone": alone.n_forward[0],
            "forwards_in_batch": together.n_forward[i],
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/batch_invariance.py", description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("decoder")
    parser.add_argument("--prompts", type=int, default=4, help="how many prompts, decoded together and alone")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--float64", action="store_true", help="run the networks in double precision")
    parser.add_argument("--check", action="store_true", help="exit 1 when any prompt differs")
    args = parser.parse_args(argv)
    if args.prompts < 2:
        parser.error(f"--prompts must be at least 2 (a batch), got {args.prompts}")
    rows = compare(args.model, args.decoder, args.prompts, args.seed, args.float64)
    precision = "float64" if args.float64 else "the model's own precision"
    print(f"{args.model}, {args.decoder}, {args.prompts} prompts at batch {args.prompts} and alone, {precision}:")
    for r in rows:
        where = "equal" if r["equal"] else f"parts at token {r['first_difference']} of {r['n_tokens']}"
        print(f"  {r['prompt']}: {where}; forwards alone {r['forwards_alone']}, in the batch {r['forwards_in_batch']}")
    return 1 if args.check and not all(r["equal"] for r in rows) else 0
