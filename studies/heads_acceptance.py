"""The draft heads a run decoded with, and their acceptance on held-out images, as each heads directory's record
(heads.json, which a run keeps in its decoder config) measured it when the heads were trained."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def heads_records(rows: pd.DataFrame) -> dict[str, dict]:
    """By heads directory: the record of the trained heads some decoder of the run read (random heads have none)."""
    configs = json.loads(rows["decoder_configs"].iloc[0])
    found: dict[str, dict] = {}
    for decoder in rows["decoder"]:
        heads = (configs.get(decoder) or {}).get("heads")
        if not isinstance(heads, dict) or not isinstance(heads.get("record"), dict):
            continue
        if (heads["record"].get("measured") or {}).get("acceptance"):
            found.setdefault(str(heads["weights"]), heads["record"])
    return found


def heads_acceptance_lines(rows: pd.DataFrame) -> list[str]:
    """One line per heads directory: whether its heads read the token, and sum_x min(p, q) per offset on the
    images its training held out, beside the same heads untrained."""
    found = heads_records(rows)
    if not found:
        return []
    lines = ["The draft heads these rows read, with their acceptance per offset on held-out images (sum_x min(p, q) "
             "through the shared pipeline, as each heads directory's record measured it at training; untrained in "
             "parentheses):", ""]  # fmt: skip
    return [*lines, *(heads_line(weights, record) for weights, record in found.items()), ""]


def heads_line(weights: str, record: dict) -> str:
    measured = record["measured"]
    offsets = sorted(measured["acceptance"], key=int)
    shown = ", ".join(f"+{d}: {measured['acceptance'][d]:.3f} ({measured['untrained'][d]:.3f})" for d in offsets)
    kind = "feature and token" if record.get("tokens") else "feature only"
    return f"- `{weights}` ({kind}; {measured['images']} held-out images): {shown}."


def shipped_heads(root: Path) -> dict[str, dict]:
    """Every heads directory under sjd/assets, by its path from the checkout's root: its heads.json."""
    found = {}
    for path in sorted((root / "sjd" / "assets").glob("*heads_*/heads.json")):
        found[str(path.parent.relative_to(root))] = json.loads(path.read_text())
    return found


def shipped_heads_lines(results: pd.DataFrame, root: Path) -> list[str]:
    """The shipped heads of every model on which some run of the page read trained heads, side by side: which read
    the token, and each one's held-out acceptance per offset (its record's), so heads of one recipe with and
    without the token compare on the same held-out images."""
    models = set()
    for _, rows in results.groupby("run_dir", sort=False) if "run_dir" in results else []:
        if heads_records(rows):
            models |= set(rows["model"].astype(str))
    shipped = {w: r for w, r in shipped_heads(root).items() if (r.get("target") or {}).get("name") in models}
    if not shipped:
        return []
    lines = ["## The shipped draft heads of these models", "",
             "Each heads directory the checkout ships for a model above, with its acceptance per offset on the "
             "images its training held out (sum_x min(p, q), its heads.json's record; untrained in parentheses). "
             "Heads trained by one command but for `heads.tokens=true` read the same data and the same held-out "
             "images.", ""]  # fmt: skip
    for weights, record in shipped.items():
        lines.append(heads_line(weights, record) + f" Trained by `{record['command']}`.")
    return [*lines, ""]
