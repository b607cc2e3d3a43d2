"""The shipped stand-ins' recipes and their checkpoints' training records.

sjd/standin/build.py (run by `scripts/train_standin.py`) trains from these recipes and writes the records; the
tests read both to check that every shipped checkpoint is its recipe's. A recipe is DEFAULTS overridden by a
STANDINS entry.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sjd.standin.procedural import RECIPE_DEFAULTS

ASSETS = Path(__file__).resolve().parents[1] / "assets"
# The shipped family (conf/model/standin_*.yaml): each one's arguments. Threads are part of the recipe:
# the same arguments on another thread count give slightly different weights.
STANDINS = {
    "standin_lumina_512": dict(resolution=512, noise=0.03, streak=0.05, streak_corr=0.6),
    "standin_lumina_512_smooth": dict(resolution=512, noise=0.04, streak=0.0),
    "standin_lumina_512_low": dict(resolution=512, noise=0.01, streak=0.0),
    "standin_lumina_768": dict(resolution=768, noise=0.03, streak=0.05, streak_corr=0.6),
    "standin_llamagen_512": dict(family="llamagen", resolution=512, noise=0.03, streak=0.05, streak_corr=0.6),
    # Calibrated to the three published Lumina-mGPT ratios (docs/results/standin_calibration.md): a row tint the
    # caption does not name ties each code to its whole row, a column streak to the row above.
    "standin_lumina_512_cal": dict(
        resolution=512, noise=0.03, streak=0.05, streak_corr=0.6, vstreak=0.1, row_tint=0.14, steps=400
    ),
    "standin_lumina_768_cal": dict(
        resolution=768, noise=0.03, streak=0.05, streak_corr=0.6, vstreak=0.1, row_tint=0.14, steps=400
    ),
}
DEFAULTS = RECIPE_DEFAULTS


def checkpoint_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every safetensors file under a checkpoint directory, named by file and key."""
    from safetensors.torch import load_file

    return {f"{path.relative_to(directory)}:{k}": v for path in sorted(directory.rglob("*.safetensors"))
            for k, v in load_file(path).items()}  # fmt: skip


def read_record(directory: Path) -> dict:
    """A checkpoint's training record: standin.json (LlamaGen), or config.json's `standin` entry (Lumina)."""
    if (directory / "standin.json").is_file():
        return json.loads((directory / "standin.json").read_text())
    return json.loads((directory / "config.json").read_text())["standin"]


def write_record(directory: Path, rec: dict) -> None:
    """Rewrite the training record in place (standin.json, or config.json's `standin` entry)."""
    if (directory / "standin.json").is_file():
        (directory / "standin.json").write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
        return
    config = json.loads((directory / "config.json").read_text())
    config["standin"] = rec
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
