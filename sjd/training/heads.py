"""What `scripts/train_heads.py` does: train parallel draft heads (sjd/drafters/heads.py) for a model with the
`features` capability (the script's docstring says how to call it).

1. the drafter recipe's data (steps 1 and 2 of scripts/train_drafter.py, by sjd.training.drafter): the model's own
   AR samples of captions of its own caption space and their teacher-forced features, read from `data.cache` where
   a drafter's training (or an earlier run of this one) made them with the same `data` keys;
2. the heads' training (sjd.drafters.heads_training) on all images but the last `measure_images`;
3. their acceptance per head on those held-out images, sum_x min(p, q) through the shared pipeline;
4. `out`: heads.safetensors and heads.json (offsets, target, recipe, its hash, the command, the data's and the
   weights' hashes, the training log, the acceptance, git hash and versions).

Rerunning a finished command with an unchanged recipe does nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from sjd.drafters.heads import CONFIG_FILE, WEIGHTS_FILE, DraftHeads, HeadsConfig, read_heads_config, save_heads
from sjd.drafters.heads_training import HeadsTrainSettings, acceptance, train_heads
from sjd.drafters.recipe import file_sha256, recipe_sha, target_identity
from sjd.training.drafter import (
    cached_parts,
    data_key,
    load_target,
    pick_device,
    primed_head,
    sampling_of,
    training_captions,
    training_data,
    validate_arguments,
)

SCRIPT = "scripts/train_heads.py"


def recipe_arguments(cfg: DictConfig) -> dict:
    """Every argument that changes the trained heads (not `out`, `device`, `cache`, progress)."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    data = {k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items() if k != "cache"}
    return {
        "model": {k: model[k] for k in ("name", "adapter", "sampling")},
        "data": data,
        "heads": heads_arguments(cfg.heads),
        "train": HeadsTrainSettings.from_dict(OmegaConf.to_container(cfg.train, resolve=True)).to_dict(),
        "measure_images": int(cfg.measure_images),
        "threads": int(cfg.threads),
    }


def heads_arguments(heads: DictConfig) -> dict:
    """The heads' shape: horizontal and vertical offsets, and `tokens` only where set (the recipe of heads that
    read no token hashes as before token-aware heads existed, so shipped records still match)."""
    out = {"horizontal": int(heads.horizontal), "vertical": int(heads.vertical)}
    tokens = heads.get("tokens", False)
    if not isinstance(tokens, bool):
        raise ValueError(f"heads.tokens must be true or false, got {tokens!r}")
    return {**out, "tokens": True} if tokens else out


def offsets_of(heads: dict, row_stride: int) -> tuple[int, ...]:
    """Horizontal offsets 1 .. horizontal, then one row stride per row below."""
    if heads["horizontal"] < 0 or heads["vertical"] < 0 or heads["horizontal"] + heads["vertical"] == 0:
        raise ValueError(f"heads.horizontal and heads.vertical must be >= 0 and not both 0, got {heads}")
    return tuple(range(1, heads["horizontal"] + 1)) + tuple(row_stride * r for r in range(1, heads["vertical"] + 1))


def build(cfg: DictConfig, overrides: list[str]) -> dict:
    args = recipe_arguments(cfg)
    validate_arguments({**args, "probe": {"images": 1, "steps": 1}})
    if not 0 < args["measure_images"] < args["data"]["n_images"]:
        raise ValueError(f"measure_images={args['measure_images']} must be in 1 .. data.n_images - 1")
    out = Path(cfg.out)
    sha = recipe_sha(args)
    if (out / WEIGHTS_FILE).is_file() and (out / CONFIG_FILE).is_file():
        if read_heads_config(str(out.absolute())).get("recipe_sha") == sha:
            print(f"{out}: already trained by this recipe ({sha}); nothing to do")
            return read_heads_config(str(out.absolute()))
    torch.set_num_threads(args["threads"])
    adapter = load_target(args, pick_device(str(cfg.device)))
    prompts, captions = training_captions(args, adapter)
    target = target_identity(adapter)
    cache = Path(cfg.data.cache) / f"{args['model']['name']}-{data_key(args, target)}" if cfg.data.cache else None
    offsets = offsets_of(args["heads"], adapter.layout.row_stride)
    print(f"heads {list(offsets)} for {args['model']['name']}: recipe {sha}, {len(prompts)} images, data cache {cache}")

    t0 = time.perf_counter()
    reused = cached_parts(cache, args)
    data = training_data(adapter, args, prompts, cache, bool(cfg.progress))
    data_seconds = time.perf_counter() - t0
    held = args["measure_images"]
    train, measure = data.subset(len(data) - held), type(data)(data.images[len(data) - held :])

    settings = HeadsTrainSettings(**args["train"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        shape = HeadsConfig(int(adapter.architecture()["hidden_size"]), offsets, args["heads"].get("tokens", False))
        heads = DraftHeads(shape).to(adapter.device)
    head = primed_head(adapter, prompts, args)
    untrained = acceptance(heads, adapter, sampling_of(args), measure)
    bar = progress_bar(train, settings, bool(cfg.progress))
    codes = adapter.layout.free_columns(adapter.device)
    embed = adapter.token_embeddings().detach() if heads.config.tokens else None
    history = train_heads(heads, head, train, settings, on_step=bar, codes=codes, embed=embed)
    trained = acceptance(heads, adapter, sampling_of(args), measure)
    shown = ", ".join(f"+{d}: {a:.3f} (untrained {u:.3f})" for d, a, u in zip(offsets, trained, untrained))
    print(f"acceptance per offset (sum min(p, q) on held-out images): {shown}")

    from sjd.harness.provenance import git_hash, versions

    record = {
        "target": target, "recipe": args, "recipe_sha": sha, "command": " ".join(["python", SCRIPT, *overrides]),
        "overrides": overrides, "data_sha": data.sha()[:16],
        "data": {"images": len(data), "trained_on": len(train), "held_out_for_measure": held,
                 "seconds": round(data_seconds), "cached_parts_reused": reused, **captions},
        "training": {"steps": history[-1]["step"], "seconds": history[-1]["seconds"], "final": history[-1],
                     "log": history},
        "measured": {"images": held, "acceptance": dict(zip(map(str, offsets), trained)),
                     "untrained": dict(zip(map(str, offsets), untrained))},
        "device": str(adapter.device), "git_hash": git_hash(), "versions": versions(),
    }  # fmt: skip
    save_heads(heads.cpu(), out, record)
    record["weights_sha"] = file_sha256(out / WEIGHTS_FILE)
    save_heads(heads, out, record)
    print(f"wrote {out}: weights {record['weights_sha'][:16]}, {history[-1]['seconds']:.0f} s training")
    return record


def progress_bar(data, settings: HeadsTrainSettings, show: bool):
    import math

    from tqdm import tqdm

    bar = tqdm(total=math.ceil(len(data) / settings.batch_size) * settings.epochs, desc="training", disable=not show)

    def on_step(step: int, log: dict) -> None:
        bar.update(step - bar.n)
        bar.set_postfix({"loss": f"{log['loss']:.4f}", "top1": f"{log['top1']:.3f}"}, refresh=False)
        if step == bar.total:
            bar.close()

    return on_step
