"""Prompt sets: load, validate, select, and fingerprint.

Formats, chosen by extension:
- `.tsv` / `.csv`: a header row; the caption column is `Prompt`, `prompt`, `caption` or `text`;
  an `id` column, when present, gives the prompt ids (else the 0-based row number);
- `.jsonl`: one object per line with a caption field (as above) and optionally `id` or `image_id`;
- `.txt`: one prompt per line.
Captions are stripped of surrounding whitespace and inner newlines are replaced by spaces
(COCO captions carry both). A malformed file raises `PromptFileError` naming file and line.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from sjd.models.base import Prompt

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CAPTION_KEYS = ("Prompt", "prompt", "caption", "text")
ID_KEYS = ("id", "prompt_id", "image_id")


class PromptFileError(ValueError):
    pass


@dataclass(frozen=True)
class PromptSet:
    name: str
    path: Path
    sha256: str
    n_total: int
    prompts: list[Prompt]
    selection: str  # how `prompts` was chosen from the file, recorded in every summary


def resolve_path(path: str | Path) -> Path:
    """Absolute paths as given; relative ones against the project root (where run.py lives)."""
    p = Path(path)
    return p if p.is_absolute() else PROJECT_ROOT / p


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def clean_caption(text: str) -> str:
    return " ".join(text.split())


def _pick(row: dict, keys: tuple[str, ...]) -> str | None:
    for k in keys:
        if k in row and row[k] is not None:
            return str(row[k])
    return None


def _read_rows(path: Path) -> list[tuple[int, str | None, str]]:
    """(line number, id or None, caption) for every prompt of the file."""
    suffix = path.suffix.lower()
    rows: list[tuple[int, str | None, str]] = []
    if suffix in (".tsv", ".csv"):
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ",")
            header = reader.fieldnames or []
            if not any(k in header for k in CAPTION_KEYS):
                raise PromptFileError(f"{path}:1: no caption column; expected one of {CAPTION_KEYS}, got {header}")
            for row in reader:
                caption = _pick(row, CAPTION_KEYS)
                if caption is None:
                    raise PromptFileError(f"{path}:{reader.line_num}: row has no caption field")
                rows.append((reader.line_num, _pick(row, ID_KEYS), caption))
    elif suffix == ".jsonl":
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise PromptFileError(f"{path}:{line_no}: bad JSON ({e.msg})") from None
            caption = _pick(obj, CAPTION_KEYS) if isinstance(obj, dict) else None
            if caption is None:
                raise PromptFileError(f"{path}:{line_no}: no caption field; expected one of {CAPTION_KEYS}")
            rows.append((line_no, _pick(obj, ID_KEYS), caption))
    elif suffix == ".txt":
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            rows.append((line_no, None, line))
    else:
        raise PromptFileError(f"{path}: unknown prompt file type {suffix!r} (use .tsv, .csv, .jsonl or .txt)")
    return rows


def load_prompt_file(path: str | Path) -> list[Prompt]:
    path = resolve_path(path)
    if not path.is_file():
        raise PromptFileError(f"prompt file {path} not found (config key prompts.path)")
    prompts, seen = [], set()
    for index, (line_no, pid, caption) in enumerate(_read_rows(path)):
        text = clean_caption(caption)
        if not text:
            raise PromptFileError(f"{path}:{line_no}: empty caption")
        pid = str(index) if pid is None else pid
        if pid in seen:
            raise PromptFileError(f"{path}:{line_no}: duplicate prompt id {pid!r}")
        seen.add(pid)
        prompts.append(Prompt(pid, text))
    if not prompts:
        raise PromptFileError(f"{path}: no prompts")
    return prompts


def load_prompt_set(name: str, path: str, n: int | None = None, subset_seed: int | None = None) -> PromptSet:
    """The first `n` prompts, or a seeded random subset of `n` when `subset_seed` is set."""
    resolved = resolve_path(path)
    prompts = load_prompt_file(resolved)
    total = len(prompts)
    if n is not None and n < 1:
        raise ValueError(f"prompts.n must be >= 1 or null, got {n}")
    if n is None or n >= total:
        chosen, selection = prompts, f"all {total}"
    elif subset_seed is None:
        chosen, selection = prompts[:n], f"first {n} of {total}"
    else:
        idx = sorted(random.Random(subset_seed).sample(range(total), n))
        chosen, selection = [prompts[i] for i in idx], f"{n} of {total}, seed {subset_seed}"
    return PromptSet(name, resolved, file_sha256(resolved), total, chosen, selection)
