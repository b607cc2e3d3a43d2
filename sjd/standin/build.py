"""Building a stand-in from its recipe, and checking a checkpoint against one; `scripts/train_standin.py` is
its command line.

The model is a tiny Chameleon with Lumina-mGPT's grammar at the real layout (sjd.standin.lumina), or a LlamaGen
GPT at LlamaGen-XL's (sjd.standin.llamagen); the data are procedural code images (sjd.standin.procedural)
generated from (seed, step), so a build is a pure function of its recipe and thread count. The texture noise sets
the per-token entropy. The checkpoint's config.json (standin.json for LlamaGen) records every argument, the final
loss and the training time (seconds on the recipe's threads), and what ties the shipped files to the code:
`weights_sha`, of every tensor in the checkpoint's safetensors files; `recipe_sha`, of the arguments; and
`probe_fingerprint`, of the weights after the first PROBE_STEPS steps of training
(sjd.standin.training.tensors_fingerprint). The fingerprint moves with anything that changes training (data,
initialisation, loss, optimiser) but not with a CPU's float rounding, which a bit-level hash would not survive
from one machine to the next, and costs seconds to recompute, where a retrain costs minutes: `check_recipe`
recomputes all three, `check_retrain` retrains in full and compares every tensor bit for bit (which holds on a
CPU of the building one's kind).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from sjd.models.loading import tensors_sha
from sjd.standin.lumina import build_model, character_tokenizer, save, vocabulary
from sjd.standin.procedural import ProceduralImages, all_themes, images_of
from sjd.standin.recipes import ASSETS, DEFAULTS, STANDINS, checkpoint_tensors, read_record, write_record
from sjd.standin.training import (
    FINGERPRINT_TOLERANCE,
    TrainSettings,
    fingerprint_gaps,
    init_code_embeddings,
    init_llamagen_code_embeddings,
    llamagen_loss,
    lumina_loss,
    train,
)

PROMPTS = ASSETS / "prompts" / "standin.tsv"
PROBE_STEPS = 3


def write_prompts(path: Path) -> None:
    """Every caption of the stand-ins' grammar, in a seeded shuffled order (so the first n vary)."""
    themes = all_themes()
    order = np.random.default_rng(0).permutation(len(themes))
    lines = ["id\tPrompt"] + [f"standin{i:03d}\t{themes[j].caption}" for i, j in enumerate(order)]
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path} ({len(themes)} captions)")


def build(name: str, settings: dict, out: Path | None, probe_only: bool = False) -> dict:
    """Train `name` from `settings` (over DEFAULTS) and write it to `out`; returns its record. With
    `probe_only`, train the first PROBE_STEPS steps, write nothing and return probe()'s record."""
    a = {**DEFAULTS, **settings}
    if a["family"] not in ("lumina", "llamagen"):
        raise SystemExit(f"--family must be lumina or llamagen, got {a['family']!r}")
    torch.set_num_threads(a["threads"])
    return (build_llamagen if a["family"] == "llamagen" else build_lumina)(name, a, out, probe_only)


def data_and_settings(a: dict, n_codes: int) -> tuple[ProceduralImages, TrainSettings]:
    images = images_of(a, n_codes)
    return images, TrainSettings(steps=a["steps"], batch_size=a["batch_size"], lr=a["lr"], seed=a["seed"])


def recipe_sha(a: dict) -> str:
    """The recipe's hash: its arguments (what the training code does with them is the probe's to check)."""
    return hashlib.sha256(json.dumps(a, sort_keys=True).encode()).hexdigest()[:16]


def probe(a: dict, history: list[dict]) -> dict:
    """The recipe's hash and the weights' fingerprint after its first PROBE_STEPS steps."""
    fingerprint = next(h["probe_fingerprint"] for h in history if "probe_fingerprint" in h)
    return {"recipe_sha": recipe_sha(a), "probe_fingerprint": fingerprint}


def record(a: dict, n_codes: int, history: list[dict]) -> dict:
    """What config.json / standin.json keeps: the recipe and how training ended (weights_sha once written)."""
    losses = [h for h in history if "loss" in h]
    return {**a, "n_codes": n_codes, "final_loss_nats": round(losses[-1]["loss"], 4),
            "train_seconds": round(losses[-1]["seconds"]), **probe(a, history)}  # fmt: skip


def finish(out: Path, rec: dict) -> dict:
    """Add the hash of the files just written to their record."""
    rec = {**rec, "weights_sha": tensors_sha(checkpoint_tensors(out))[:16]}
    write_record(out, rec)
    print(f"wrote {out} (recipe {rec['recipe_sha']}, weights {rec['weights_sha']})")
    return rec


def build_llamagen(name: str, a: dict, out: Path | None, probe_only: bool) -> dict:
    from sjd.models.llamagen import LlamaGenAdapter
    from sjd.standin import llamagen

    if a["resolution"] != 512:
        raise SystemExit("a LlamaGen stand-in has LlamaGen-XL's 512 px layout (32 x 32 codes): --resolution 512")
    n_codes = 16384
    parts = llamagen.build_parts(a["hidden"], a["layers"], a["heads"], a["seed"])
    adapter = LlamaGenAdapter.from_parts(*parts, name=name)
    images, settings = data_and_settings(a, n_codes)
    print(f"{name}: {a}")
    init_llamagen_code_embeddings(adapter, images)
    history = train(adapter.gpt, lambda step: llamagen_loss(adapter, images, settings, step), settings,
                    probe_steps=min(PROBE_STEPS, a["steps"]), probe_only=probe_only)  # fmt: skip
    if probe_only:
        return probe(a, history)
    rec = record(a, n_codes, history)
    llamagen.save(adapter.gpt, *parts[1:], out, rec)
    return finish(out, rec)


def build_lumina(name: str, a: dict, out: Path | None, probe_only: bool) -> dict:
    from sjd.models.lumina import LuminaAdapter

    n_codes = 8192
    model = build_model(n_codes, a["hidden"], a["layers"], a["heads"], max_positions=4096, seed=a["seed"])
    tokenizer = character_tokenizer(vocabulary(n_codes))
    grids = a["resolution"] // 32
    adapter = LuminaAdapter.from_model(model, tokenizer, grids, grids, name=name)
    images, settings = data_and_settings(a, n_codes)
    print(f"{name}: {a}")
    init_code_embeddings(adapter, images)
    history = train(adapter.model, lambda step: lumina_loss(adapter, images, settings, step), settings,
                    probe_steps=min(PROBE_STEPS, a["steps"]), probe_only=probe_only)  # fmt: skip
    if probe_only:
        return probe(a, history)
    rec = record(a, n_codes, history)
    save(adapter.model, tokenizer, out, rec)
    return finish(out, rec)


def checkpoint_and_recipe(target: str) -> tuple[Path, str, dict, dict]:
    """(directory, name, record, recipe arguments) of a shipped stand-in's name or a checkpoint directory.
    A shipped one's record must give the arguments of its STANDINS entry."""
    directory = ASSETS / target if target in STANDINS else Path(target)
    if not directory.is_dir():
        raise SystemExit(f"{target!r} is neither a shipped stand-in ({', '.join(STANDINS)}) nor a checkpoint directory")
    rec = read_record(directory)
    name = target if target in STANDINS else directory.name
    recipe = {**DEFAULTS, **STANDINS[name]} if target in STANDINS else {k: rec[k] for k in DEFAULTS if k in rec}
    return directory, name, rec, recipe


def check_recipe(target: str) -> list[str]:
    """What is wrong with a checkpoint against the current recipe: [] when its files hash to its record, its
    arguments to its recipe hash, and the recipe's first PROBE_STEPS steps reproduce its probe fingerprint
    within FINGERPRINT_TOLERANCE (a CPU's rounding, not a change of code)."""
    directory, name, rec, recipe = checkpoint_and_recipe(target)
    if "recipe_sha" not in rec:
        return [f"{directory}: its record has no recipe_sha: an earlier recipe built it; rebuild it with "
                f"`python scripts/train_standin.py {name}` and rerun the results rows on it"]  # fmt: skip
    problems = [f"{directory}: its record says {k}={rec.get(k)!r}, the recipe {v!r}"
                for k, v in recipe.items() if rec.get(k) != v]  # fmt: skip
    weights = tensors_sha(checkpoint_tensors(directory))[:16]
    if weights != rec.get("weights_sha"):
        problems.append(f"{directory}: its weights hash to {weights}, its record says {rec.get('weights_sha')}")
    if "probe_fingerprint" not in rec:
        return [*problems, f"{directory}: its record has no probe_fingerprint: an earlier version of the script "
                           f"built it; rebuild it with `python scripts/train_standin.py {name}`"]  # fmt: skip
    ours = build(name, recipe, None, probe_only=True)
    if ours["recipe_sha"] != rec["recipe_sha"]:
        problems.append(f"{directory}: its arguments hash to {ours['recipe_sha']}, its record says {rec['recipe_sha']}")
    gaps = fingerprint_gaps(ours["probe_fingerprint"], rec["probe_fingerprint"])
    worst = max(gaps, key=gaps.get)
    if gaps[worst] > FINGERPRINT_TOLERANCE:
        problems.append(f"{directory}: after {PROBE_STEPS} steps the current recipe's weights differ from the "
                        f"checkpoint's record by up to {gaps[worst]:.3g} of a tensor's rms ({worst}), past the "
                        f"{FINGERPRINT_TOLERANCE:g} a CPU's rounding stays under: the code that trains it changed "
                        "since it was built")  # fmt: skip
    return problems


def check_retrain(target: str) -> list[str]:
    """Retrain a checkpoint from its recipe in full and compare every tensor of the result with its files."""
    directory, name, _, recipe = checkpoint_and_recipe(target)
    with tempfile.TemporaryDirectory() as tmp:
        build(name, recipe, Path(tmp))
        ours, theirs = checkpoint_tensors(Path(tmp)), checkpoint_tensors(directory)
    if ours.keys() != theirs.keys():
        return [f"{directory}: the retrain writes tensors {sorted(ours.keys() ^ theirs.keys())} it does not"]
    differ = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    gap = {k: float((ours[k].float() - theirs[k].float()).abs().max()) for k in differ}
    return [f"{directory}: {k} differs from the retrain by up to {gap[k]:.3g}" for k in differ]


# What each check establishes when it passes, in its own words: check_recipe does not retrain.
PASSED = {
    check_recipe: (f"its files hash to its record, its arguments to the recipe's hash, and the recipe's first "
                   f"{PROBE_STEPS} training steps reproduce its recorded fingerprint (not a full retrain: "
                   "--check retrains and compares bit for bit)"),
    check_retrain: "reproduced bit for bit by a full retrain of the current recipe",
}  # fmt: skip
