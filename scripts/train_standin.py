"""Train a stand-in Lumina-mGPT on procedural images and write its checkpoint under sjd/assets.

    python scripts/train_standin.py standin_lumina_512    # rebuild one shipped stand-in (STANDINS)
    python scripts/train_standin.py all                   # rebuild every one
    python scripts/train_standin.py prompts               # rewrite sjd/assets/prompts/standin.tsv
    python scripts/train_standin.py --custom x --noise 0.02 --steps 5 --out /tmp/x   # a new one, or a smoke run

The model is a tiny Chameleon with Lumina-mGPT's grammar at the real layout (sjd.standin.lumina);
the data are procedural code images (sjd.standin.procedural) generated from (seed, step), so a run
is a pure function of its arguments and thread count. The texture noise sets the per-token entropy.
The checkpoint's config.json (standin.json for LlamaGen) records every argument, the final loss and the
training time: minutes on one CPU thread.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from sjd.standin.lumina import build_model, character_tokenizer, save, vocabulary
from sjd.standin.procedural import ProceduralImages, all_themes
from sjd.standin.training import (
    TrainSettings,
    init_code_embeddings,
    init_llamagen_code_embeddings,
    llamagen_loss,
    lumina_loss,
    train,
)

ASSETS = Path(__file__).resolve().parents[1] / "sjd" / "assets"
# The shipped family (conf/model/standin_*.yaml): each one's arguments. Threads are part of the recipe:
# the same arguments on another thread count give slightly different weights.
STANDINS = {
    "standin_lumina_512": dict(resolution=512, noise=0.03, streak=0.05, streak_corr=0.6),
    "standin_lumina_512_smooth": dict(resolution=512, noise=0.04, streak=0.0),
    "standin_lumina_512_low": dict(resolution=512, noise=0.01, streak=0.0),
    "standin_lumina_768": dict(resolution=768, noise=0.03, streak=0.05, streak_corr=0.6),
    "standin_llamagen_512": dict(family="llamagen", resolution=512, noise=0.03, streak=0.05, streak_corr=0.6),
}
DEFAULTS = dict(family="lumina", resolution=512, noise=0.04, streak=0.0, streak_corr=0.85, steps=200, batch_size=4,
                lr=3e-3, hidden=64, layers=2, heads=4, seed=0, codebook_seed=0, threads=1)  # fmt: skip


PROMPTS = ASSETS / "prompts" / "standin.tsv"


def write_prompts(path: Path) -> None:
    """Every caption of the stand-ins' grammar, in a seeded shuffled order (so the first n vary)."""
    themes = all_themes()
    order = np.random.default_rng(0).permutation(len(themes))
    lines = ["id\tPrompt"] + [f"standin{i:03d}\t{themes[j].caption}" for i, j in enumerate(order)]
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path} ({len(themes)} captions)")


def build(name: str, settings: dict, out: Path) -> None:
    a = {**DEFAULTS, **settings}
    if a["family"] not in ("lumina", "llamagen"):
        raise SystemExit(f"--family must be lumina or llamagen, got {a['family']!r}")
    torch.set_num_threads(a["threads"])
    (build_llamagen if a["family"] == "llamagen" else build_lumina)(name, a, out)


def data_and_settings(a: dict, n_codes: int) -> tuple[ProceduralImages, TrainSettings]:
    images = ProceduralImages(n_codes=n_codes, noise=a["noise"], codebook_seed=a["codebook_seed"], streak=a["streak"],
                              streak_corr=a["streak_corr"])  # fmt: skip
    return images, TrainSettings(steps=a["steps"], batch_size=a["batch_size"], lr=a["lr"], seed=a["seed"])


def record(a: dict, n_codes: int, history: list[dict]) -> dict:
    """What config.json / standin.json keeps: the recipe and how training ended."""
    return {**a, "n_codes": n_codes, "final_loss_nats": round(history[-1]["loss"], 4),
            "train_seconds": round(history[-1]["seconds"])}  # fmt: skip


def build_llamagen(name: str, a: dict, out: Path) -> None:
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
    history = train(adapter.gpt, lambda step: llamagen_loss(adapter, images, settings, step), settings)
    llamagen.save(adapter.gpt, *parts[1:], out, record(a, n_codes, history))
    print(f"wrote {out}")


def build_lumina(name: str, a: dict, out: Path) -> None:
    from sjd.models.lumina import LuminaAdapter

    n_codes = 8192
    model = build_model(n_codes, a["hidden"], a["layers"], a["heads"], max_positions=4096, seed=a["seed"])
    tokenizer = character_tokenizer(vocabulary(n_codes))
    grids = a["resolution"] // 32
    adapter = LuminaAdapter.from_model(model, tokenizer, grids, grids, name=name)
    images, settings = data_and_settings(a, n_codes)
    print(f"{name}: {a}")
    init_code_embeddings(adapter, images)
    history = train(adapter.model, lambda step: lumina_loss(adapter, images, settings, step), settings)
    save(adapter.model, tokenizer, out, record(a, n_codes, history))
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"shipped stand-ins to rebuild ({', '.join(STANDINS)}), or all")
    ap.add_argument("--custom", help="train a stand-in of this name from the options below instead")
    for key, value in DEFAULTS.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value)
    ap.add_argument("--out", type=Path, help="default sjd/assets/<name>")
    args = ap.parse_args()
    if args.custom:
        build(args.custom, {k: getattr(args, k) for k in DEFAULTS}, args.out or ASSETS / args.custom)
        return
    if args.names == ["prompts"]:
        write_prompts(PROMPTS)
        return
    names = list(STANDINS) if args.names == ["all"] else args.names
    unknown = [n for n in names if n not in STANDINS]
    if unknown or not names:
        ap.error(f"unknown stand-in(s) {unknown}; one of {list(STANDINS)} or all" if unknown else "name a stand-in")
    for name in names:
        build(name, STANDINS[name], args.out or ASSETS / name)


if __name__ == "__main__":
    main()
