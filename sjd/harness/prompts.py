"""Prompt sets: load, validate, select, and fingerprint.

Formats, chosen by extension:
- `.tsv` / `.csv`: a header row; the caption column is `Prompt`, `prompt`, `caption` or `text`;
  an `id` column, when present, gives the prompt ids (else the 0-based row number);
- `.jsonl`: one object per line with a caption field (as above) and optionally `id` or `image_id`;
- `.txt`: one prompt per line;
- `.json`: COCO caption annotations, read with pycocotools; one prompt per image (the
  longest of its captions, the first in annotation order on ties, as SJD and LANTERN do),
  images in ascending id order, prompt id = image id.
A delimited file can set `delimiter` and `quoting: none` (LlamaGen's COCO-30k file is a
one-column file whose captions contain commas and quote characters).
Captions are stripped of surrounding whitespace and inner newlines are replaced by spaces
(COCO captions carry both). A malformed file raises `PromptFileError` naming file and line.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path

from sjd.types import Prompt

PROJECT_ROOT = Path(__file__).resolve().parents[2]
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


def _coco_longest(path: Path) -> list[tuple[int, str | None, str]]:
    from pycocotools.coco import COCO  # imported here: it prints on load and is only needed for COCO

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            coco = COCO(str(path))
    except (ValueError, KeyError, AssertionError) as e:
        raise PromptFileError(f"{path}:1: not a COCO captions file ({e})") from None
    rows = []
    for image_id in sorted(coco.imgs):
        captions = [a["caption"] for a in coco.loadAnns(coco.getAnnIds(imgIds=image_id))]
        if not captions:
            raise PromptFileError(f"{path}: image {image_id} has no caption")
        rows.append((0, str(image_id), max(captions, key=len)))  # max keeps the first on ties
    return rows


def _read_rows(path: Path, delimiter: str | None = None, quoting: str = "csv") -> list[tuple[int, str | None, str]]:
    """(line number, id or None, caption) for every prompt of the file."""
    suffix = path.suffix.lower()
    rows: list[tuple[int, str | None, str]] = []
    if suffix == ".json":
        return _coco_longest(path)
    if suffix in (".tsv", ".csv"):
        delimiter = delimiter or ("\t" if suffix == ".tsv" else ",")
        mode = csv.QUOTE_NONE if quoting == "none" else csv.QUOTE_MINIMAL
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter=delimiter, quoting=mode)
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
        raise PromptFileError(f"{path}: unknown prompt file type {suffix!r} (use .tsv, .csv, .jsonl, .txt or .json)")
    return rows


def load_prompt_file(path: str | Path, delimiter: str | None = None, quoting: str = "csv") -> list[Prompt]:
    path = resolve_path(path)
    if not path.is_file():
        raise PromptFileError(f"prompt file {path} not found (config key prompts.path)")
    prompts, seen = [], set()
    for index, (line_no, pid, caption) in enumerate(_read_rows(path, delimiter, quoting)):
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


def load_prompt_set(
    name: str,
    path: str,
    n: int | None = None,
    subset_seed: int | None = None,
    sha256: str | None = None,
    delimiter: str | None = None,
    quoting: str = "csv",
    skip: int = 0,
) -> PromptSet:
    """The first `n` prompts, or a seeded random subset of `n` when `subset_seed` is set, of the file's prompts
    after its first `skip` (a run on prompts disjoint from another's). With `sha256` set, a file whose hash
    differs is refused (the set is not what it claims)."""
    resolved = resolve_path(path)
    digest = file_sha256(resolved) if resolved.is_file() else None
    if sha256 and digest and digest != sha256:
        raise PromptFileError(
            f"{resolved}: sha256 {digest} differs from prompts.sha256 {sha256}; restore the file, update "
            "the config, or use prompts=file for a file of your own"
        )
    prompts = load_prompt_file(resolved, delimiter, quoting)
    if skip < 0 or skip >= len(prompts):
        raise ValueError(f"prompts.skip must be in [0, {len(prompts)}), got {skip}")
    prompts = prompts[skip:]
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
    if skip:
        selection += f", after the first {skip}"
    return PromptSet(name, resolved, digest or file_sha256(resolved), total, chosen, selection)
