"""Pre-tokenised training sequences for SJD2 fine-tuning of a real model (scripts/finetune_sjd2_hf.py).

A shard is one `.safetensors` file holding
    input_ids    int32 [N, T]  row n: the adapter's conditional prompt row for the caption (what
                               `prompt_batch` feeds the model, e.g. Lumina's BOS + question +
                               end-of-turn, Emu3's BOS + caption + suffix + image prefix), then the
                               image's generated stream (the layout's `n_tokens` ids: begin-of-image,
                               size tokens, codes, end-of-line, ... as the decoders produce them),
                               right-padded with -1
    image_start  int32 [N]     index in row n of generated position 0 (the prompt's length)
and string metadata: format "sjd2-shard", version "1", `family` (lumina | emu3) and `n_tokens`.
One shard holds one image size (`n_tokens`); the fine-tune checks every stream against the
adapter's layout, so a shard made for another resolution or model fails before training.
`prompt_row` and `image_stream` build rows from a caption and a VQ code grid through the adapter,
so the shards hold exactly what the adapter reads at inference.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sjd.models.base import ModelAdapter
from sjd.types import ImageLayout, Prompt

FORMAT, VERSION, PAD = "sjd2-shard", "1", -1


def prompt_row(adapter: ModelAdapter, caption: str) -> list[int]:
    """The conditional prompt ids the adapter feeds the model for `caption` (no padding)."""
    ids, lengths = adapter.prompt_batch([Prompt("train", caption)], with_uncond=False)
    return ids[0, ids.shape[1] - lengths[0] :].tolist()


def uncond_row(adapter: ModelAdapter) -> list[int]:
    """The adapter's unconditional prompt row (Lumina: end-of-turn; Emu3: the negative prompt),
    which replaces the caption for CFG dropout."""
    ids, lengths = adapter.prompt_batch([Prompt("train", "unconditional")], with_uncond=True)
    return ids[1, ids.shape[1] - lengths[1] :].tolist()


def image_stream(layout: ImageLayout, code_ids: torch.Tensor, codes: torch.Tensor) -> list[int]:
    """The generated stream of an image: `codes` [height, width] VQ indices at the layout's free
    positions in raster order (as `image_codes` reads them back), the forced tokens elsewhere."""
    if tuple(codes.shape) != (layout.height, layout.width):
        raise ValueError(f"codes {tuple(codes.shape)} do not fill the {layout.height} x {layout.width} grid")
    stream = layout.forced.clone()
    stream[layout.forced < 0] = code_ids[codes.flatten().long()]
    return stream.tolist()


def write_shard(path: Path, examples: Sequence[tuple[Sequence[int], Sequence[int]]], family: str) -> None:
    """(prompt row, stream) pairs -> one shard; every stream must have one length."""
    if not examples:
        raise ValueError("a shard needs at least one example")
    n_tokens = {len(s) for _, s in examples}
    if len(n_tokens) != 1:
        raise ValueError(f"one shard holds one image size; got streams of lengths {sorted(n_tokens)}")
    width = max(len(p) + len(s) for p, s in examples)
    ids = torch.full((len(examples), width), PAD, dtype=torch.int32)
    for n, (p, s) in enumerate(examples):
        ids[n, : len(p) + len(s)] = torch.tensor([*p, *s], dtype=torch.int32)
    start = torch.tensor([len(p) for p, _ in examples], dtype=torch.int32)
    meta = {"format": FORMAT, "version": VERSION, "family": family, "n_tokens": str(n_tokens.pop())}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"input_ids": ids, "image_start": start}, str(path), metadata=meta)


def read_shards(paths: Sequence[Path], family: str, layout: ImageLayout) -> list[tuple[list[int], list[int]]]:
    """Every (prompt row, stream) pair of the shards, each stream checked against `layout`."""
    examples: list[tuple[list[int], list[int]]] = []
    forced = layout.forced
    for path in paths:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT or meta.get("version") != VERSION:
                raise ValueError(f"{path}: not an {FORMAT} v{VERSION} file (metadata {meta})")
            if meta.get("family") != family:
                raise ValueError(f"{path}: a shard for {meta.get('family')!r}, not {family!r}")
            if int(meta["n_tokens"]) != layout.n_tokens:
                raise ValueError(
                    f"{path}: streams of {meta['n_tokens']} tokens, the model's layout has {layout.n_tokens} "
                    "(another resolution?)"
                )
            ids, start = f.get_tensor("input_ids").long(), f.get_tensor("image_start").long()
        for row, s in zip(ids, start.tolist()):
            stream = row[s : s + layout.n_tokens]
            if len(stream) < layout.n_tokens or (stream < 0).any():
                raise ValueError(f"{path}: a row ends before its {layout.n_tokens}-token stream does")
            if (stream[forced >= 0] != forced[forced >= 0]).any() or not layout.free_tokens[stream[forced < 0]].all():
                raise ValueError(f"{path}: a stream does not follow the model's layout (forced or code ids)")
            examples.append((row[:s].tolist(), stream.tolist()))
    if not examples:
        raise ValueError("no training examples in the shards")
    return examples
