"""The drafter recipe's data: the target's own samples, with the features a teacher-forced pass gives them.

Self-distilled, as LANTERN trains its Lumina-mGPT drafter: the target samples images for captions of its own
caption space at its own sampling settings (the caller's `sample`, AR decoding with per-prompt generators), then
one teacher-forced pass per image runs the prompt and the sampled tokens through the adapter (`prefill`, then
one `forward(tokens, start=0)`) and keeps every slot's `Logits.features.hidden`: of the conditional row and,
with CFG, of the unconditional row. At inference the drafter runs both rows, each on its own features, so
both are learnt (sjd.drafters.training picks one per image and step).

A row holds its ids, the prompt's then the generated tokens (P + N of them), and the features after each id but
the last (P + N - 1): feature j is the target's state after ids 0..j, the f_j of EAGLE's pairs (f_j, id_{j+1}).

Generation goes in parts of a few images, each written to the cache directory as soon as it is done, so a
killed run keeps what it made; the directory is named by a hash of everything that makes the data but their
number (the caller's key: image k's prompt must not depend on how many there are), and a rerun, or a run of
more images, reads the parts it finds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from sjd.models.base import ModelAdapter
from sjd.types import Prompt

# sample(prompts) -> [B, n_tokens] generated ids: the target's own samples at its sampling settings
Sampler = Callable[[Sequence[Prompt]], torch.Tensor]


@dataclass
class Row:
    """One CFG row of one image: `ids` [P + N] (prompt, then generated) and `features` [P + N - 1, H]."""

    ids: torch.Tensor
    features: torch.Tensor
    prompt_len: int


@dataclass
class DrafterData:
    """Per image its rows: the conditional row, then (with CFG) the unconditional row."""

    images: list[list[Row]]

    def __len__(self) -> int:
        return len(self.images)

    def subset(self, n: int) -> DrafterData:
        return DrafterData(self.images[:n])

    def sha(self) -> str:
        """sha256 of every row's ids and features (dtype, shape and bytes), in order: equal only bit for bit."""
        digest = hashlib.sha256()
        for rows in self.images:
            digest.update(f"rows{len(rows)}|".encode())
            for row in rows:
                for t in (row.ids, row.features):
                    t = t.contiguous()
                    digest.update(f"{t.dtype}|{tuple(t.shape)}|{row.prompt_len}|".encode())
                    digest.update(t.view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()


@torch.no_grad()
def teacher_forced_rows(adapter: ModelAdapter, prompts: Sequence[Prompt], tokens: torch.Tensor, with_uncond: bool):
    """Per prompt its rows (conditional, then unconditional with CFG) for generated `tokens` [B, N], through the
    adapter's own API: a prefill gives the prompt slots' features, one forward of tokens 0..N-2 the rest (the
    feature after the last token predicts nothing)."""
    B = len(prompts)
    prefill = adapter.prefill(prompts, with_uncond).features
    if prefill is None or prefill.ids is None or prefill.lengths is None:
        raise ValueError(f"model {adapter.name!r}: its prefill gives no features with prompt ids and lengths")
    generated = adapter.forward(tokens[:, :-1].to(adapter.device), [0] * B).features.hidden
    T = prefill.hidden.shape[1]
    images = [[] for _ in range(B)]
    for r in range(prefill.hidden.shape[0]):
        P = int(prefill.lengths[r])
        features = torch.cat([prefill.hidden[r, T - P :], generated[r]]).cpu()
        ids = torch.cat([prefill.ids[r, T - P :].cpu(), tokens[r % B].cpu()])
        images[r % B].append(Row(ids.long(), features, P))
    return images


def part_paths(cache: Path, n_images: int, part_size: int) -> list[Path]:
    """The cache files of images 0 .. n_images - 1, `part_size` a part: named by their first image and count, so
    a run of more images (whose first ones are the same prompts) reads the whole parts a smaller run made."""
    return [
        cache / f"part-{start:06d}-{min(part_size, n_images - start):04d}.pt" for start in range(0, n_images, part_size)
    ]


def save_part(path: Path, images: list[list[Row]]) -> None:
    state = {"images": [[{"ids": r.ids, "features": r.features, "prompt_len": r.prompt_len} for r in rows]
                        for rows in images]}  # fmt: skip
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # a part is there whole or not at all


def load_part(path: Path) -> list[list[Row]]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    return [[Row(r["ids"], r["features"], int(r["prompt_len"])) for r in rows] for rows in state["images"]]


def make_data(
    adapter: ModelAdapter,
    prompts: Sequence[Prompt],
    sample: Sampler,
    with_uncond: bool,
    cache: Path | None,
    part_size: int,
    progress: Callable[[int], None] = lambda done: None,
) -> DrafterData:
    """Samples and features of `prompts`, made `part_size` images at a time; with a `cache` directory each part
    is kept there and a rerun reads the parts it finds instead of making them again."""
    images: list[list[Row]] = []
    paths = [None] * len(prompts) if cache is None else part_paths(cache, len(prompts), part_size)
    for path, start in zip(paths, range(0, len(prompts), part_size)):
        chunk = list(prompts[start : start + part_size])
        if path is not None and path.is_file():
            part = load_part(path)
        else:
            part = teacher_forced_rows(adapter, chunk, sample(chunk), with_uncond)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                save_part(path, part)
        if len(part) != len(chunk):
            raise ValueError(f"{path}: holds {len(part)} images, the recipe makes {len(chunk)} there; delete it")
        images += part
        progress(len(images))
    return DrafterData(images)
