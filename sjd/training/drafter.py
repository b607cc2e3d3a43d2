"""What `scripts/train_drafter.py` does: train an EAGLE drafter for a model with the `features` capability (the
script's docstring says how to call it); its checks against a record are sjd.training.drafter_checks.

It lives at the harness's layer, above every layer it composes: the model adapters it trains for, AR decoding for the
target's own samples (sjd.decoders.ar), the caption spaces (sjd.toy, sjd.standin) and the prompt files
(sjd.harness.prompts). The recipe's pieces are in sjd.drafters (data, training, recipe).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from sjd.drafters.checkpoint import save_drafter
from sjd.drafters.data import DrafterData, make_data, part_paths
from sjd.drafters.recipe import (
    STATE_FILE,
    WEIGHTS_FILE,
    drop_frozen,
    file_sha256,
    read_record,
    recipe_sha,
    target_identity,
    write_record,
)
from sjd.drafters.training import TrainSettings, init_drafter, target_head, train
from sjd.types import FEATURES, Prompt

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "scripts/train_drafter.py"
PROMPTS = ROOT / "sjd" / "assets" / "prompts"
# The evaluation prompts each caption space keeps out of training: (file, how many of its first captions; None =
# all). Every stand-in caption is in standin.tsv (it lists the whole grammar), so the stand-ins hold out the first
# 32, which the runs on them evaluate (prompts.n up to 32), and draw the rest with other generators.
HELD_OUT = {"toy_scenes": (PROMPTS / "toy.tsv", None), "standin_themes": (PROMPTS / "standin.tsv", 32),
            "micro": (None, None)}  # fmt: skip
SPACES = tuple(HELD_OUT)
TOY_CAPTION_SEED = 20260601  # neither the toy's training seeds nor its prompt file's


# -- the recipe's arguments ----------------------------------------------------------------------------------
def recipe_arguments(cfg: DictConfig) -> dict:
    """Every argument that changes the trained weights (not `out`, `device`, `cache`, checkpointing, progress)."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    data = {k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items() if k != "cache"}
    return {
        "model": {k: model[k] for k in ("name", "adapter", "sampling")},
        "data": data,
        "train": TrainSettings.from_dict(OmegaConf.to_container(cfg.train, resolve=True)).to_dict(),
        "probe": OmegaConf.to_container(cfg.probe, resolve=True),
        "threads": int(cfg.threads),
    }


def validate_arguments(args: dict) -> None:
    """Refuse bad values before any model loads, naming the key and the value."""
    data, probe = args["data"], args["probe"]
    for key, value, low in (("data.n_images", data["n_images"], 1), ("data.batch_size", data["batch_size"], 1),
                            ("probe.images", probe["images"], 1), ("probe.steps", probe["steps"], 1),
                            ("threads", args["threads"], 1)):  # fmt: skip
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{key} must be an integer >= {low}, got {value!r}")
    if probe["images"] > data["n_images"]:
        raise ValueError(f"probe.images={probe['images']} exceeds data.n_images={data['n_images']}")
    for key in ("captions", "held_out"):
        value = data[key]
        if value not in (None, "auto", *SPACES) and not resolve_prompts(value).is_file():
            raise FileNotFoundError(f"data.{key}={value!r}: neither a caption space {SPACES} nor a prompt file")


def resolve_prompts(path: str) -> Path:
    from sjd.harness.prompts import resolve_path

    return resolve_path(path)


def sampling_of(args: dict):
    from sjd.core.sampling import SamplingConfig

    return SamplingConfig(**args["model"]["sampling"])


# -- captions --------------------------------------------------------------------------------------------------
def caption_space(args: dict, adapter) -> str:
    name = args["data"]["captions"]
    if name != "auto":
        return name
    from sjd.models.micro import MicroAdapter
    from sjd.models.toy import ToyAdapter
    from sjd.standin.adapter import StandinLlamaGenAdapter, StandinLuminaAdapter

    if isinstance(adapter, ToyAdapter):
        return "toy_scenes"
    if isinstance(adapter, StandinLuminaAdapter | StandinLlamaGenAdapter):
        return "standin_themes"
    if isinstance(adapter, MicroAdapter):
        return "micro"
    raise ValueError(
        f"data.captions=auto: model {adapter.name!r} has no caption space of its own here; set data.captions to a "
        "prompt file of captions of its training distribution (not its evaluation prompts)"
    )


def held_out_captions(args: dict, space: str) -> tuple[set[str], str]:
    """The captions never trained on, and a description of them for the record."""
    from sjd.harness.prompts import load_prompt_file

    path, n = HELD_OUT.get(space, (None, None)) if args["data"]["held_out"] == "auto" else (
        args["data"]["held_out"], None)  # fmt: skip
    n = args["data"]["held_out_n"] if args["data"]["held_out_n"] is not None else n
    if path is None:
        return set(), "none"
    prompts = load_prompt_file(path)
    chosen = prompts if n is None else prompts[:n]
    where = Path(path).resolve()
    where = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    return {p.text for p in chosen}, f"{'all' if n is None else f'the first {n}'} of {where}"


def training_captions(args: dict, adapter) -> tuple[list[Prompt], dict]:
    """The recipe's captions, ids `drafter-train-k` (no prompt file uses them), and how they were chosen."""
    space = caption_space(args, adapter)
    held, held_desc = held_out_captions(args, space)
    n, seed = args["data"]["n_images"], args["data"]["seed"]
    if space == "toy_scenes":
        from sjd.toy.scenes import sample_scene

        rng = np.random.Generator(np.random.PCG64([TOY_CAPTION_SEED, seed]))
        texts = []
        while len(texts) < n:
            caption = sample_scene(rng).caption
            if caption not in held:
                texts.append(caption)
    elif space == "standin_themes":
        from sjd.standin.procedural import all_themes

        pool = [t.caption for t in all_themes() if t.caption not in held]
        order = np.random.default_rng(seed).permutation(len(pool))
        texts = [pool[order[k % len(pool)]] for k in range(n)]
    elif space == "micro":
        texts = ["a" if k % 2 == 0 else "b" for k in range(n)]
    else:
        from sjd.harness.prompts import load_prompt_file

        pool = [p.text for p in load_prompt_file(space) if p.text not in held]
        if len(pool) < n:
            raise ValueError(
                f"data.captions={space}: {len(pool)} captions outside the held-out ones, data.n_images={n}"
            )
        texts = pool[:n]
    prompts = [Prompt(f"drafter-train-{k:05d}", t) for k, t in enumerate(texts)]
    adapter.check_prompts(prompts)
    overlap = len({p.text for p in prompts} & held)
    return prompts, {"space": space, "held_out": held_desc, "distinct": len(set(texts)), "overlap_held_out": overlap}


# -- data ------------------------------------------------------------------------------------------------------
def ar_sampler(adapter, args: dict):
    """The target's own AR samples at its sampling settings, each from its prompt's own generator."""
    from sjd.core.seeding import make_generators
    from sjd.decoders.ar import ARDecoder

    sampling, seed = sampling_of(args), args["data"]["seed"]

    def sample(prompts):
        generators = make_generators(seed, [p.prompt_id for p in prompts], adapter.device)
        return ARDecoder().generate(adapter, prompts, sampling, generators).tokens

    return sample


def data_key(args: dict, target: dict) -> str:
    """What names a data cache: everything that makes image k, not how many images there are."""
    data = {k: v for k, v in args["data"].items() if k != "n_images"}
    return recipe_sha({"model": args["model"], "data": data, "target": target})


def cached_parts(cache: Path | None, args: dict) -> int:
    if cache is None:
        return 0
    return sum(p.is_file() for p in part_paths(cache, args["data"]["n_images"], args["data"]["batch_size"]))


def training_data(adapter, args: dict, prompts, cache: Path | None, progress: bool) -> DrafterData:
    from tqdm import tqdm

    bar = tqdm(total=len(prompts), desc="samples + features", unit="img", disable=not progress)
    data = make_data(adapter, prompts, ar_sampler(adapter, args), sampling_of(args).uses_uncond, cache,
                     args["data"]["batch_size"], progress=lambda done: bar.update(done - bar.n))  # fmt: skip
    bar.close()
    return data


def primed_head(adapter, prompts, args: dict):
    """The target's head for training (sjd.drafters.training.target_head), after the prefill it needs (the data
    may all have come from the cache, with no prefill run)."""
    adapter.prefill(prompts[:1], sampling_of(args).uses_uncond)
    return target_head(adapter)


# -- the probe -------------------------------------------------------------------------------------------------
# The probe's samples are kept beside the drafter: a sampled token is a discontinuous function of the logits, so on
# another CPU (instruction set, thread count) one draw in a few thousand falls on the other side of a cut and the
# rest of that image changes with it. Teacher forcing and the first training steps from fixed samples are
# continuous: their rounding stays orders of magnitude under the fingerprint's tolerance.
PROBE_SAMPLES_FILE = "probe_samples.safetensors"


def probe_samples(adapter, args: dict, prompts) -> torch.Tensor:
    """The target's AR samples of the recipe's first probe.images captions (images x layout tokens)."""
    return ar_sampler(adapter, args)(prompts[: args["probe"]["images"]])


def samples_sha(samples: torch.Tensor) -> str:
    return hashlib.sha256(samples.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


def probe_fingerprint(adapter, args: dict, prompts, samples: torch.Tensor) -> dict:
    """The fingerprint of the weights after the recipe's first probe.steps steps on its first probe.images
    images, teacher-forced afresh from `samples` in one part (as --check-recipe does)."""
    from sjd.standin.training import tensors_fingerprint

    k = args["probe"]["images"]
    if samples.shape[0] != k:
        raise ValueError(f"the probe takes {k} images; {samples.shape[0]} samples were given")
    data = make_data(adapter, prompts[:k], lambda chunk: samples, sampling_of(args).uses_uncond, None, k)
    settings = TrainSettings(**args["train"])
    net = init_drafter(adapter, settings.seed)
    train(net, primed_head(adapter, prompts, args), data, settings, max_steps=args["probe"]["steps"])
    return tensors_fingerprint({k: v for k, v in net.state_dict().items() if k != "embed_tokens.weight"})


def save_probe_samples(directory: Path, samples: torch.Tensor) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({"samples": samples.to(torch.int64).contiguous().cpu()}, str(directory / PROBE_SAMPLES_FILE))


def load_probe_samples(directory: Path) -> torch.Tensor | None:
    from safetensors.torch import load_file

    path = directory / PROBE_SAMPLES_FILE
    return load_file(str(path))["samples"] if path.is_file() else None


# -- how much it accepts --------------------------------------------------------------------------------------
def measure(net, adapter, args: dict, prompts, n: int) -> dict | None:
    """First-level acceptance (sjd.drafters.quality) of the drafter and of its untrained initialisation (the
    `random` drafter when train.seed is 0) on `n` images it never trained on: the first captions, sampled with
    other generators (ids drafter-measure-k). Not part of the recipe: it changes no weight."""
    from sjd.drafters.quality import first_level_acceptance

    if n < 1:
        return None
    held = [Prompt(f"drafter-measure-{k:05d}", p.text) for k, p in enumerate(prompts[:n])]
    sampling = sampling_of(args)
    data = make_data(adapter, held, ar_sampler(adapter, args), sampling.uses_uncond, None, args["data"]["batch_size"])
    head = primed_head(adapter, held, args)
    trained = first_level_acceptance(net, head, adapter, data, sampling)
    untrained = first_level_acceptance(init_drafter(adapter, args["train"]["seed"]), head, adapter, data, sampling)
    out = {"images": n, "positions": trained["positions"]}
    out["sampled"] = {"accept": round(trained["overlap"], 4), "untrained": round(untrained["overlap"], 4),
                      "ceiling": 1.0}  # fmt: skip
    for k in (1, 10):
        out[f"top{k}"] = {"accept": round(trained[f"accept_{k}"], 4), "untrained": round(untrained[f"accept_{k}"], 4),
                          "ceiling": round(trained[f"ceiling_{k}"], 4)}  # fmt: skip
        print(
            f"first-level acceptance with {k} children on {n} held-out images: {out[f'top{k}']['accept']:.3f} "
            f"(untrained {out[f'top{k}']['untrained']:.3f}; a perfect drafter {out[f'top{k}']['ceiling']:.3f})"
        )
    print(f"first-level acceptance of one child drawn from q (1 - TV(p, q)): {out['sampled']['accept']:.3f} "
          f"(untrained {out['sampled']['untrained']:.3f}; a perfect drafter 1)")  # fmt: skip
    return out


# -- training --------------------------------------------------------------------------------------------------
def load_target(args: dict, device: str):
    from hydra.utils import instantiate

    adapter = instantiate(args["model"]["adapter"], device=device)
    if FEATURES not in adapter.capabilities:
        raise ValueError(f"model {args['model']['name']!r} lacks the {FEATURES!r} capability: no drafter can read it")
    return adapter


def drafter_architecture(adapter) -> dict:
    """The target's config for the drafter's config.json (the released layout): without a stand-in's training
    record, which describes how the target was made, not what the drafter's layer is."""
    return {k: v for k, v in adapter.architecture().items() if k != "standin"}


def pick_device(name: str) -> str:
    from sjd.harness.runner import pick_device as pick

    return pick(name)


def build(cfg: DictConfig, overrides: list[str]) -> dict:
    """Train the drafter `cfg` describes into `cfg.out` (resuming a killed run) and return its record."""
    args = recipe_arguments(cfg)
    validate_arguments(args)
    out = Path(cfg.out)
    sha = recipe_sha(args)
    done = read_record(out) if (out / WEIGHTS_FILE).is_file() else None
    if done is not None and done.get("recipe_sha") == sha:
        print(f"{out}: already trained by this recipe ({sha}); nothing to do")
        return done
    device = pick_device(str(cfg.device))
    torch.set_num_threads(args["threads"])
    adapter = load_target(args, device)
    prompts, captions = training_captions(args, adapter)
    target = target_identity(adapter)
    key = data_key(args, target)
    cache = Path(cfg.data.cache) / f"{args['model']['name']}-{key}" if cfg.data.cache else None
    print(f"drafter for {args['model']['name']}: recipe {sha}, {len(prompts)} images ({captions['space']}), "
          f"data cache {cache}, out {out}")  # fmt: skip

    t0 = time.perf_counter()
    reused = cached_parts(cache, args)
    data = training_data(adapter, args, prompts, cache, bool(cfg.progress))
    data_seconds = time.perf_counter() - t0
    data_sha = data.sha()[:16]

    settings = TrainSettings(**args["train"])
    net = init_drafter(adapter, settings.seed)
    meta = {"recipe_sha": sha, "data_sha": data_sha}
    head = primed_head(adapter, prompts, args)
    history = train_with_progress(net, head, data, settings, out / STATE_FILE, int(cfg.checkpoint_every), meta,
                                  bool(cfg.progress))  # fmt: skip
    samples = probe_samples(adapter, args, prompts)
    fingerprint = probe_fingerprint(adapter, args, prompts, samples)
    measured = measure(net, adapter, args, prompts, int(cfg.measure_images))
    data_info = {"images": len(data), "rows": sum(len(r) for r in data.images), "seconds": round(data_seconds),
                 "cached_parts_reused": reused, **captions}  # fmt: skip
    record = training_record(args, sha, overrides, target, data_sha, data_info, history, fingerprint, measured, device)
    record["probe"]["samples_sha"] = samples_sha(samples)
    save_probe_samples(out, samples)
    write_drafter(net, adapter, out, record)
    print(f"wrote {out}: weights {record['weights_sha'][:16]}, final loss {history[-1]['loss']:.4f}, "
          f"top-1 agreement {history[-1]['top1']:.3f}, {history[-1]['seconds']:.0f} s training")  # fmt: skip
    return record


def training_record(
    args: dict,
    sha: str,
    overrides: list[str],
    target: dict,
    data_sha: str,
    data_info: dict,
    history: list[dict],
    fingerprint: dict,
    measured: dict | None,
    device: str,
) -> dict:
    """drafter.json's record (sjd.drafters.recipe says what each part is), before the weights' hash."""
    from sjd.harness.provenance import git_hash, versions
    from sjd.standin.training import FINGERPRINT_TOLERANCE

    probe = {"images": args["probe"]["images"], "steps": args["probe"]["steps"], "fingerprint": fingerprint,
             "tolerance": FINGERPRINT_TOLERANCE}  # fmt: skip
    training = {"steps": history[-1]["step"], "seconds": history[-1]["seconds"], "final": history[-1], "log": history}
    return {"recipe": args, "recipe_sha": sha, "command": " ".join(["python", SCRIPT, *overrides]),
            "overrides": overrides, "target": target, "data_sha": data_sha, "data": data_info, "training": training,
            "probe": probe, "measured": measured, "device": device, "git_hash": git_hash(),
            "versions": versions()}  # fmt: skip


def write_drafter(net, adapter, out: Path, record: dict) -> None:
    """The released layout without the frozen embedding, the record with the weights' hash; the resumable
    training state goes once the drafter is written."""
    save_drafter(net.cpu(), out, drafter_architecture(adapter), record)
    drop_frozen(out)
    record["weights_sha"] = file_sha256(out / WEIGHTS_FILE)
    write_record(out, record)
    (out / STATE_FILE).unlink(missing_ok=True)


def train_with_progress(net, head, data, settings, state_path, every, meta, progress) -> list[dict]:
    from tqdm import tqdm

    from sjd.drafters.training import steps_per_epoch

    bar = tqdm(total=steps_per_epoch(len(data), settings) * settings.epochs, desc="training", disable=not progress)

    def on_step(step: int, log: dict) -> None:
        bar.update(step - bar.n)
        shown = {"loss": f"{log['loss']:.4f}"}
        if log["top1"] is not None:
            shown["top1"] = f"{log['top1']:.3f}"
        bar.set_postfix(shown, refresh=False)

    history = train(net, head, data, settings, state_path=state_path,
                    checkpoint_every=every, meta=meta, on_step=on_step)  # fmt: skip
    bar.close()
    return history
