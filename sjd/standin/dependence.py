"""How far a stand-in's predictions reach back: the distance its next-code distributions move when one earlier
code changes, by how many codes back that code is; `scripts/standin_dependence.py` is its command line.

For a stand-in: procedural images of its own recipe, one teacher-forced forward for every code's distribution p_t,
then, for each of `n_changes` positions s, the code at s redrawn from p_s and a second forward. The profile is the
mean total-variation distance between the two p_{s+d} at each offset d (in codes, raster order; a row is 32 codes
at 512 px). Coupled decoders keep a draft whose distribution barely moves when an earlier draft changes, so a
model whose predictions depend on the previous code only converges under coupling far faster than one whose
predictions move a little with every earlier code, as a real model's do. It measures; it asserts nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sjd.standin.adapter import ASSETS, StandinLlamaGenAdapter, StandinLuminaAdapter
from sjd.standin.training import TrainSettings, llamagen_batch, make_batch


def lumina_profile(adapter: StandinLuminaAdapter, settings: TrainSettings, n_changes: int, offsets: list[int]):
    ids, mask, positions, where, _ = make_batch(adapter, adapter.images, settings, step=0)

    def probs(tokens: torch.Tensor) -> torch.Tensor:
        hidden = adapter.model.model(input_ids=tokens, attention_mask=mask, position_ids=positions).last_hidden_state
        picked = hidden.gather(1, where[..., None].expand(-1, -1, hidden.shape[-1]))
        return torch.softmax(picked @ adapter.model.lm_head.weight[adapter.vocab.code_ids].T, -1)

    def change(tokens: torch.Tensor, s: int, codes: torch.Tensor) -> torch.Tensor:
        out = tokens.clone()
        out[torch.arange(len(out)), where[:, s] + 1] = adapter.vocab.code_ids[codes]
        return out

    return shifts(probs, ids, change, n_changes, offsets)


def llamagen_profile(adapter: StandinLlamaGenAdapter, settings: TrainSettings, n_changes: int, offsets: list[int]):
    captions, codes, _ = llamagen_batch(adapter, adapter.images, settings, step=0)
    gpt = adapter.gpt
    features, prefix_mask = adapter.encode_captions(captions)
    caption = gpt.caption_embeddings(features)

    def probs(tokens: torch.Tensor) -> torch.Tensor:
        embeds = torch.cat([caption, gpt.tok_embeddings(tokens[:, :-1])], 1)
        return torch.softmax(gpt(embeds, prefix_mask=prefix_mask)[:, gpt.config.cls_token_num - 1 :], -1)

    def change(tokens: torch.Tensor, s: int, new: torch.Tensor) -> torch.Tensor:
        out = tokens.clone()
        out[:, s] = new
        return out

    return shifts(probs, codes, change, n_changes, offsets)


@torch.no_grad()
def shifts(probs, tokens, change, n_changes: int, offsets: list[int]) -> dict[int, float]:
    """offset -> mean TV of p_{s+offset} when the code at s is redrawn from p_s, over `n_changes` positions s."""
    base = probs(tokens)
    n_codes = base.shape[1]
    changes = sorted(np.random.default_rng(0).integers(n_codes // 10, n_codes - max(offsets) - 1, n_changes).tolist())
    generator = torch.Generator().manual_seed(0)
    moved = {d: [] for d in offsets}
    for s in changes:
        redrawn = torch.multinomial(base[:, s], 1, generator=generator)[:, 0]
        after = probs(change(tokens, s, redrawn))
        for d in offsets:
            moved[d].append(float(0.5 * (base[:, s + d] - after[:, s + d]).abs().sum(-1).mean()))
    return {d: float(np.mean(v)) for d, v in moved.items()}


def load(target: str) -> StandinLuminaAdapter | StandinLlamaGenAdapter:
    """A shipped stand-in's name or a checkpoint directory -> its adapter."""
    directory = ASSETS / target if (ASSETS / target).is_dir() else Path(target)
    if (directory / "standin.json").is_file():
        return StandinLlamaGenAdapter(weights=str(directory))
    return StandinLuminaAdapter(weights=str(directory))


def dependence(target: str, n_changes: int, n_images: int, offsets: list[int]) -> dict[int, float]:
    """The profile of one stand-in (a shipped name or a checkpoint directory): offset -> mean TV, over `n_images`
    images that no training step saw."""
    adapter = load(target)
    settings = TrainSettings(batch_size=n_images, seed=777, p_uncond=0.0)  # images no training step saw
    profile = llamagen_profile if isinstance(adapter, StandinLlamaGenAdapter) else lumina_profile
    return profile(adapter, settings, n_changes, offsets)


def print_profiles(targets: list[str], n_changes: int, n_images: int, offsets: list[int]) -> None:
    """One markdown row per stand-in, each printed as soon as it is measured (on one torch thread)."""
    torch.set_num_threads(1)
    print("| stand-in | " + " | ".join(f"d={d}" for d in offsets) + " |")
    print("| --- | " + " | ".join("---:" for _ in offsets) + " |")
    for target in targets:
        profile = dependence(target, n_changes, n_images, offsets)
        print(f"| {target} | " + " | ".join(f"{profile[d]:.3f}" for d in offsets) + " |")
