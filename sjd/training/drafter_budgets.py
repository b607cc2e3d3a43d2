"""The calibrated drafter's budget search: our drafter recipe at several training budgets, each read by how far
EAGLE's step compression over official SJD lands from the published one.

    python -m sjd.training.drafter_budgets [key=value ...]      # conf/drafter_budgets.yaml

A drafter trained on a tiny stand-in imitates it far better than a one-layer drafter imitates a 7B model, so at the
recipe's full budget its EAGLE compresses well above the published EAGLE over SJD. A smaller budget (fewer images,
fewer epochs) makes a weaker drafter. Per budget (`budgets`: [images, epochs]) the search trains the recipe
(sjd.training.drafter.build, as `scripts/train_drafter.py` would, into `drafters`/<model>_<images>x<epochs>; a
rerun reuses a finished one), reads the acceptance its record measured on held-out images, then decodes
`n_prompts` evaluation prompts (never trained on) with `drafted` (EAGLE-1's static tree with that drafter) and once
with `reference` (official-schedule SJD), each prompt from the generator a run with `seed` gives it. One row a
budget goes to `out`: the acceptance, both decoders' forwards per image, the drafted decoder's step compression over
the reference's, and the published figure it is read against (`published`, from results/paper/published.csv); the
budget nearest it is marked `chosen`. Its row names the training command, the hash of its recipe's arguments and
its weights' hash; the shipped calibrated drafter's record must name the chosen budget and recipe (record_matches).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "conf" / "drafter_budgets.yaml"
COLUMNS = ["model", "images", "epochs", "accept_sampled", "accept_top1", "accept_top10", "accept_images",
           "reference", "drafted", "n_prompts", "seed", "reference_forwards", "drafted_forwards",
           "steps_over_reference", "published", "off_published", "chosen", "recipe_sha", "weights_sha",
           "train_seconds", "decode_seconds", "command", "git_hash"]  # fmt: skip


def search_config(args: list[str], path: Path = CONFIG) -> DictConfig:
    """conf/drafter_budgets.yaml with `key=value` overrides; an unknown key or a bad budget is named."""
    cfg = OmegaConf.load(path)
    OmegaConf.set_struct(cfg, True)
    for arg in args:
        key = arg.split("=", 1)[0]
        if "=" not in arg or OmegaConf.select(cfg, key, default=KeyError) is KeyError:
            raise ValueError(f"{arg!r}: not a key=value override of a key in {path}")
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(args))
    budgets = OmegaConf.to_container(cfg.budgets)
    for budget in budgets:
        if not (isinstance(budget, list) and len(budget) == 2 and all(isinstance(v, int) and v >= 1 for v in budget)):
            raise ValueError(f"budgets: each budget is [images, epochs], integers >= 1; got {budget!r}")
    if len({tuple(b) for b in budgets}) != len(budgets) or not budgets:
        raise ValueError(f"budgets must be distinct and at least one, got {budgets}")
    for key in ("n_prompts", "batch_size"):
        if not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"{key} must be an integer >= 1, got {cfg[key]!r}")
    return cfg


def published_target(cfg: DictConfig) -> float:
    """The published step compression of `published.method` over `published.over` (results/paper/published.csv)."""
    table = pd.read_csv(ROOT / cfg.published.file)
    rows = table[table["table"] == cfg.published.table].set_index("method")["step_compression"]
    missing = [m for m in (cfg.published.method, cfg.published.over) if m not in rows.index]
    if missing:
        raise ValueError(f"published: {cfg.published.file} has no row {missing} in table {cfg.published.table!r}")
    return float(rows[cfg.published.method]) / float(rows[cfg.published.over])


def train_overrides(cfg: DictConfig, images: int, epochs: int) -> list[str]:
    """What `scripts/train_drafter.py` is given for one budget (its recipe: the budget and `train_overrides`)."""
    out = Path(cfg.drafters) / f"{cfg.model}_{images}x{epochs}"
    return [f"model={cfg.model}", f"out={out}", f"data.n_images={images}", f"train.epochs={epochs}",
            "progress=false", *cfg.train_overrides]  # fmt: skip


def train_budget(cfg: DictConfig, images: int, epochs: int) -> tuple[dict, float]:
    """The budget's drafter (trained, or found already trained by the same recipe) and its record, with seconds."""
    from sjd.training.drafter import build
    from sjd.training.drafter_checks import compose

    overrides = train_overrides(cfg, images, epochs)
    started = time.perf_counter()
    record = build(compose(overrides), overrides)
    return record, time.perf_counter() - started


def make_decoder(spec: DictConfig, drafter: str | None = None):
    """conf/decoder/<spec.config>.yaml with the spec's settings, and a drafter's weights where given."""
    from hydra.utils import instantiate

    from sjd.harness.decoder_configs import decoder_config

    settings = {k: v for k, v in OmegaConf.to_container(spec).items() if k != "config"}
    if drafter is not None:
        settings["drafter"] = {"weights": drafter}
    return instantiate(OmegaConf.merge(decoder_config(spec.config), settings))


def forwards_per_image(adapter, decoder, prompts, sampling, seed: int, batch_size: int) -> list[int]:
    """Each prompt's forwards with `decoder`, sample 0 of a run with `seed` (sjd.core.seeding.sample_generators)."""
    from sjd.core.seeding import sample_generators

    decoder.check(adapter)
    forwards = []
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        generators = sample_generators(seed, [(p.prompt_id, 0) for p in chunk], adapter.device)
        forwards += decoder.generate(adapter, chunk, sampling, generators).n_forward
    return forwards


def evaluation(cfg: DictConfig):
    """The target adapter, its sampling settings and the evaluation prompts."""
    from hydra.utils import instantiate

    from sjd.core.sampling import SamplingConfig
    from sjd.harness.prompts import load_prompt_set
    from sjd.harness.runner import pick_device

    model = OmegaConf.load(ROOT / "conf" / "model" / f"{cfg.model}.yaml")
    adapter = instantiate(model.adapter, device=pick_device("auto"))
    prompts = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "prompts" / f"{cfg.prompts}.yaml"))
    chosen = load_prompt_set(**{**prompts, "n": cfg.n_prompts}).prompts
    adapter.check_prompts(chosen)
    return adapter, SamplingConfig(**OmegaConf.to_container(model.sampling)), chosen


def budget_row(cfg: DictConfig, images: int, epochs: int, record: dict, reference: list[int], drafted: list[int],
               seconds: tuple[float, float], target: float) -> dict:  # fmt: skip
    from sjd.harness.provenance import git_hash

    measured = record.get("measured") or {}
    ratio = (sum(reference) / len(reference)) / (sum(drafted) / len(drafted))
    return {"model": cfg.model, "images": images, "epochs": epochs,
            "accept_sampled": measured.get("sampled", {}).get("accept"),
            "accept_top1": measured.get("top1", {}).get("accept"),
            "accept_top10": measured.get("top10", {}).get("accept"), "accept_images": measured.get("images"),
            "reference": cfg.reference.name, "drafted": cfg.drafted.name, "n_prompts": len(drafted),
            "seed": cfg.seed, "reference_forwards": sum(reference) / len(reference),
            "drafted_forwards": sum(drafted) / len(drafted), "steps_over_reference": ratio, "published": target,
            "off_published": ratio / target - 1, "chosen": False, "recipe_sha": record["recipe_sha"],
            "weights_sha": record["weights_sha"], "train_seconds": round(seconds[0], 1),
            "decode_seconds": round(seconds[1], 1), "command": record["command"], "git_hash": git_hash()}  # fmt: skip


def mark_chosen(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with `chosen` set on the budget whose step compression over the reference lands nearest the
    published figure (the smaller budget, images then epochs, on a tie)."""
    out = rows.assign(chosen=False).sort_values(["images", "epochs"], kind="stable").reset_index(drop=True)
    out.loc[out["off_published"].abs().idxmin(), "chosen"] = True
    return out[COLUMNS]


RESUMED_KEYS = ("model", "reference", "drafted", "n_prompts", "seed")  # a kept row's search settings, as recorded


def finished_rows(cfg: DictConfig, target: float) -> dict[tuple[int, int], dict]:
    """The rows `cfg.out` already holds from a search with the same model, decoders, prompt count, seed and
    published figure, by budget: a rerun keeps a row whose budget trained the same recipe into the same weights
    instead of decoding it again (other decoder settings are not in a row: a search that changes them writes
    another `out`)."""
    path = Path(cfg.out)
    if not path.is_file():
        return {}
    wanted = {"model": cfg.model, "reference": cfg.reference.name, "drafted": cfg.drafted.name,
              "n_prompts": cfg.n_prompts, "seed": cfg.seed}  # fmt: skip
    kept = {}
    hashes = {"recipe_sha": str, "weights_sha": str, "git_hash": str}  # hex: never read as a number
    for row in pd.read_csv(path, dtype=hashes).to_dict("records"):
        if all(str(row[k]) == str(wanted[k]) for k in RESUMED_KEYS) and abs(row["published"] / target - 1) < 1e-5:
            kept[(int(row["images"]), int(row["epochs"]))] = row
    return kept


def search(cfg: DictConfig) -> pd.DataFrame:
    """Every budget's row, the chosen one marked, written to `cfg.out` (after each budget, so a killed search
    leaves what it finished; a rerun retrains nothing already trained and decodes no budget `out` already holds
    for the same recipe and weights: finished_rows)."""
    import torch

    target = published_target(cfg)
    finished = finished_rows(cfg, target)
    adapter, sampling, prompts = evaluation(cfg)
    reference = None
    rows = []
    for images, epochs in OmegaConf.to_container(cfg.budgets):
        record, train_s = train_budget(cfg, images, epochs)
        done = finished.get((images, epochs))
        if done is not None and (done["recipe_sha"], done["weights_sha"]) == (record["recipe_sha"],
                                                                             record["weights_sha"]):  # fmt: skip
            rows.append({k: done[k] for k in COLUMNS})
            print(f"{images} images x {epochs} epochs: kept from {cfg.out} (git {done['git_hash']})")
            continue
        torch.set_num_threads(record["recipe"]["threads"])  # decode as the recipe trained: its thread count
        started = time.perf_counter()
        if reference is None:
            reference = forwards_per_image(adapter, make_decoder(cfg.reference), prompts, sampling, cfg.seed,
                                           cfg.batch_size)  # fmt: skip
        drafter = str(Path(cfg.drafters) / f"{cfg.model}_{images}x{epochs}")
        drafted = forwards_per_image(adapter, make_decoder(cfg.drafted, drafter), prompts, sampling, cfg.seed,
                                     cfg.batch_size)  # fmt: skip
        rows.append(budget_row(cfg, images, epochs, record, reference, drafted,
                               (train_s, time.perf_counter() - started), target))  # fmt: skip
        write_rows(cfg, rows)
        row = rows[-1]
        print(f"{images} images x {epochs} epochs: {cfg.drafted.name} over {cfg.reference.name} "
              f"{row['steps_over_reference']:.3f} (published {target:.3f}), 1 - TV {row['accept_sampled']}; "
              f"train {row['train_seconds']:.0f} s, decode {row['decode_seconds']:.0f} s")  # fmt: skip
    return write_rows(cfg, rows)


def write_rows(cfg: DictConfig, rows: list[dict]) -> pd.DataFrame:
    table = mark_chosen(pd.DataFrame(rows))
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(cfg.out, index=False, float_format="%.6g")
    return table


def chosen_budget(table: pd.DataFrame) -> pd.Series:
    """The search's chosen row; an error if the table marks none or several."""
    chosen = table[table["chosen"].astype(bool)]
    if len(chosen) != 1:
        raise ValueError(f"a budget search marks exactly one budget chosen; this one marks {len(chosen)}")
    return chosen.iloc[0]


def record_matches(row: pd.Series, record: dict) -> list[str]:
    """How a drafter's record departs from a search row (empty: it names that row): its budget and the hash of
    its recipe's arguments. Not its weights' hash: the recipe's AR samples are draws, and on another CPU a draw in
    a few thousand falls on the other side of a cut, so the same recipe trains other bits there (the row keeps
    the hash its machine got)."""
    recipe = record["recipe"]
    found = {"images": recipe["data"]["n_images"], "epochs": recipe["train"]["epochs"],
             "recipe_sha": record["recipe_sha"]}  # fmt: skip
    return [f"{key}: the row's {row[key]!r}, the record's {value!r}" for key, value in found.items()
            if str(row[key]) != str(value)]  # fmt: skip


def main(args: list[str]) -> int:
    table = search(search_config(args))
    row = chosen_budget(table)
    print(f"chosen: {row['images']} images x {row['epochs']} epochs ({row['steps_over_reference']:.3f} against "
          f"{row['published']:.3f}); train it with: {row['command']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
