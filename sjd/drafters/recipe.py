"""Our drafter recipe's record: what ties a drafter directory to the command and code that trained it.

`scripts/train_drafter.py model=NAME` trains a drafter (sjd.drafters.data, sjd.drafters.training) and writes,
beside the released layout's config.json and model.safetensors, `drafter.json`:

- `recipe`: every argument that changes the result (the model's adapter and sampling settings, the data, the
  training settings, the probe's size, the CPU thread count), and `recipe_sha`, a hash of them;
- `command` and `overrides`: the command line that composed those arguments from conf/train_drafter.yaml;
- `target`: the target it was trained on (name, a hash of its token embeddings, its own training record's
  weights hash where it has one);
- `data_sha`: a hash of the samples and features it was trained on, bit for bit;
- `weights_sha`: sha256 of model.safetensors as written;
- `probe`: the fingerprint (per tensor: rms and a few fixed random projections) of the weights after the
  recipe's first few steps on a few freshly sampled images, cheap to recompute;
- how training went (its loss log, seconds), the git hash and library versions.

`--check-recipe DIR` recomputes what can be recomputed in seconds and says which of these it checked and which it
did not (sjd.drafters.recipe.Finding); `--check-retrain DIR` retrains in full and compares the weights bit for bit.

The frozen embedding is left out of model.safetensors: it is the target's own, and the loader copies the
target's (sjd.drafters.checkpoint), so the file holds only what training changed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from sjd.drafters.checkpoint import RECORD_FILE
from sjd.models.base import ModelAdapter

WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "training_state.pt"  # the resumable training state, removed once the drafter is written
FROZEN = ("embed_tokens.weight",)


def recipe_sha(args: dict) -> str:
    """The hash of a recipe's arguments (what the code does with them is the probe's to check)."""
    return hashlib.sha256(json.dumps(args, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def target_identity(adapter: ModelAdapter) -> dict:
    """What names the target a drafter was trained on: its name, a hash of its token embeddings (stored
    weights, so the same bits on any machine), and its own record's weights hash where it has one."""
    table = adapter.token_embeddings().detach().cpu().contiguous()
    digest = hashlib.sha256(f"{table.dtype}|{tuple(table.shape)}|".encode())
    digest.update(table.view(torch.uint8).numpy().tobytes())
    ident = {"name": adapter.name, "embedding_sha": digest.hexdigest()[:16]}
    record = getattr(adapter, "training_record", None) or {}
    if "weights_sha" in record:
        ident["weights_sha"] = record["weights_sha"]
    return ident


def read_record(directory: Path) -> dict | None:
    path = directory / RECORD_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def write_record(directory: Path, record: dict) -> None:
    (directory / RECORD_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def drop_frozen(directory: Path) -> None:
    """Rewrite model.safetensors without the frozen embedding (the loader takes the target's)."""
    from safetensors.torch import load_file, save_file

    path = directory / WEIGHTS_FILE
    state = {k: v for k, v in load_file(str(path)).items() if k not in FROZEN}
    save_file(state, str(path), metadata={"format": "pt"})


@dataclass(frozen=True)
class Finding:
    """One statement a check makes about a drafter directory, and whether it held."""

    ok: bool
    what: str  # short name: weights, arguments, command, target, probe
    statement: str

    def line(self) -> str:
        return f"  {'ok    ' if self.ok else 'FAILED'}  {self.what}: {self.statement}"
