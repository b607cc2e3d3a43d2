"""Stand-in models: real adapter architectures at tiny size, trained on procedural images.

A stand-in is a real model's adapter (the same prompt, grammar, CFG rows and loader) over a tiny
network trained by `scripts/train_standin.py` on procedural code images (sjd.standin.procedural) at
the real layout and codebook size, sampled with the real settings: Lumina-mGPT's (sjd.models.lumina,
a tiny Chameleon; 32 x 32 codes at 512 px or 48 x 48 at 768 px, 8192 codes) and LlamaGen's
(sjd.models.llamagen, our GPT; 32 x 32 codes at 512 px, 16384 codes). The texture noise it was trained on sets
its per-token entropy, so a family of stand-ins spans the regimes decoders meet on real models
(docs/real-models.md, "Stand-in models"). There is no VQGAN: an image is drawn by painting each
code with its codebook colour, and that colour is the code embedding GSD and LANTERN-style
acceptance read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sjd.models.base import codebook_by_id
from sjd.models.llamagen import LlamaGenAdapter
from sjd.models.lumina import QUESTION, LuminaAdapter
from sjd.standin.lumina import read_meta
from sjd.standin.procedural import ProceduralImages, Theme, images_of
from sjd.types import Prompt

ASSETS = Path(__file__).resolve().parents[1] / "assets"
PIXELS_PER_CODE = 8


def checkpoint_dir(asset: str, weights: str | None, name: str, marker: str) -> Path:
    """The stand-in's directory: `weights` if given, else sjd/assets/<asset>; it must hold `marker`."""
    directory = Path(weights).expanduser() if weights else ASSETS / asset
    if not (directory / marker).is_file():
        where = "model.adapter.weights" if weights else "model.adapter.asset"
        raise FileNotFoundError(
            f"model {name!r}: no stand-in checkpoint at {directory.absolute()} (from `{where}`); "
            "build one with `python scripts/train_standin.py`"
        )
    return directory


def paint(colours: torch.Tensor, codes: torch.Tensor) -> np.ndarray:
    """[B, h, w] code indices -> [B, h * k, w * k, 3] uint8, each code a k x k block of its colour."""
    big = colours[codes].repeat_interleave(PIXELS_PER_CODE, 1).repeat_interleave(PIXELS_PER_CODE, 2)
    return (big * 255).round().to(torch.uint8).numpy()


def procedural_images(meta: dict) -> ProceduralImages:
    return images_of(meta, int(meta["n_codes"]))


def run_record(meta: dict) -> dict:
    """The training record a run keeps in every results row: all but the probe fingerprint, a few hundred
    numbers that only `scripts/train_standin.py --check-recipe` reads."""
    return {k: v for k, v in meta.items() if k != "probe_fingerprint"}


class StandinLuminaAdapter(LuminaAdapter):
    """A shipped stand-in (`asset`, a directory under sjd/assets) or any checkpoint directory (`weights`)."""

    title = "Lumina-mGPT stand-in"

    def __init__(
        self,
        asset: str = "standin_lumina_512",
        weights: str | None = None,
        name: str = "standin_lumina_512",
        device: str = "cpu",
        resolution: int | None = None,
        dtype: str | None = "float32",
        prompt_template: str = QUESTION,
    ) -> None:
        directory = checkpoint_dir(asset, weights, name, "config.json")
        meta = read_meta(directory)
        trained = int(meta["resolution"])
        if resolution is not None and int(resolution) != trained:
            raise ValueError(
                f"model.adapter.resolution={resolution}, but the stand-in at {directory} was trained at {trained} px"
            )
        super().__init__(str(directory), None, name, device, trained, dtype, False, prompt_template)
        self.meta, self.training_record = meta, run_record(meta)
        self.images = procedural_images(meta)
        self.colours = torch.from_numpy(self.images.codebook())

    @staticmethod
    def vqgan_from(vqgan, name, device):  # no VQGAN: codes are painted with their colours
        return None

    def check_prompts(self, prompts: list[Prompt]) -> None:
        super().check_prompts(prompts)
        known = set(self.vocab.names)
        for p in prompts:
            bad = sorted({c for c in self.question(p.text) if c not in known})
            if bad:
                raise ValueError(f"prompt {p.prompt_id!r}: the stand-in's tokenizer has no character(s) {bad}")

    def code_embeddings(self) -> torch.Tensor:
        return codebook_by_id(self.colours.to(self.device), self.vocab.code_ids, self.layout)

    def decode_images(self, tokens: torch.Tensor, chunk: int = 4) -> np.ndarray:
        """Each code painted in its codebook colour, PIXELS_PER_CODE pixels a side."""
        return paint(self.colours, self.image_codes(tokens))


class StandinLlamaGenAdapter(LlamaGenAdapter):
    """A shipped LlamaGen stand-in (`asset`) or any directory (`weights`) holding gpt.safetensors,
    vq.safetensors, t5/ and standin.json (sjd.standin.llamagen)."""

    def __init__(
        self,
        asset: str = "standin_llamagen_512",
        weights: str | None = None,
        name: str = "standin_llamagen_512",
        device: str = "cpu",
        dtype: str | None = "float32",
    ) -> None:
        import json

        from sjd.standin.llamagen import VQ_FIELDS, gpt_fields

        directory = checkpoint_dir(asset, weights, name, "standin.json")
        meta = json.loads((directory / "standin.json").read_text())
        gpt = gpt_fields(int(meta["hidden"]), int(meta["layers"]), int(meta["heads"]))
        super().__init__(str(directory / "gpt.safetensors"), str(directory / "vq.safetensors"), str(directory / "t5"),
                         name, device, dtype, int(meta["resolution"]), gpt, VQ_FIELDS)  # fmt: skip
        self.meta, self.training_record = meta, run_record(meta)
        self.images = procedural_images(meta)
        self.colours = torch.from_numpy(self.images.codebook())

    def check_prompts(self, prompts: list[Prompt]) -> None:
        super().check_prompts(prompts)
        for p in prompts:  # the word-level tokenizer knows only the stand-in captions' words
            try:
                Theme.parse(p.text.lower().strip())
            except ValueError as err:
                raise ValueError(f"prompt {p.prompt_id!r}: {err}") from err

    def code_embeddings(self) -> torch.Tensor:
        return codebook_by_id(self.colours.to(self.device), torch.arange(len(self.colours)), self.layout)

    def decode_images(self, tokens: torch.Tensor, chunk: int = 8) -> np.ndarray:
        """Each code painted in its codebook colour, PIXELS_PER_CODE pixels a side."""
        side = self.layout.height
        return paint(self.colours, tokens.long().cpu().reshape(len(tokens), side, side))
