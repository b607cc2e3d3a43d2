"""Stand-in models: real adapter architectures at tiny size, trained on procedural images.

A stand-in is Lumina-mGPT's adapter (sjd.models.lumina: the same prompt, grammar, CFG rows and
loader) over a tiny Chameleon trained by `scripts/train_standin.py` on procedural code images
(sjd.standin.procedural) at the real layout, 32 x 32 codes at 512 px or 48 x 48 at 768 px, with
the real 8192-code codebook size and sampling settings. The texture noise it was trained on sets
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
from sjd.models.lumina import QUESTION, LuminaAdapter
from sjd.standin.lumina import read_meta
from sjd.standin.procedural import ProceduralImages, Theme
from sjd.types import Prompt

ASSETS = Path(__file__).resolve().parents[1] / "assets"
PIXELS_PER_CODE = 8


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
        directory = Path(weights).expanduser() if weights else ASSETS / asset
        if not (directory / "config.json").is_file():
            where = "model.adapter.weights" if weights else "model.adapter.asset"
            raise FileNotFoundError(
                f"model {name!r}: no stand-in checkpoint at {directory.absolute()} (from `{where}`); "
                "build one with `python scripts/train_standin.py`"
            )
        meta = read_meta(directory)
        trained = int(meta["resolution"])
        if resolution is not None and int(resolution) != trained:
            raise ValueError(
                f"model.adapter.resolution={resolution}, but the stand-in at {directory} was trained at {trained} px"
            )
        super().__init__(str(directory), None, name, device, trained, dtype, False, prompt_template)
        self.meta = meta
        self.images = ProceduralImages(n_codes=int(meta["n_codes"]), noise=float(meta["noise"]),
                                       codebook_seed=int(meta["codebook_seed"]), streak=float(meta.get("streak", 0)),
                                       streak_corr=float(meta.get("streak_corr", 0.85)))  # fmt: skip
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
        colours = self.colours[self.image_codes(tokens)]  # [B, h, w, 3] in [0, 1]
        big = colours.repeat_interleave(PIXELS_PER_CODE, 1).repeat_interleave(PIXELS_PER_CODE, 2)
        return (big * 255).round().to(torch.uint8).numpy()

    def procedural_codes(self, caption: str, rng: np.random.Generator) -> np.ndarray:
        """[h, w] codes of one training-distribution image for `caption` (what the stand-in imitates)."""
        layout = self.layout
        return self.images.sample(Theme.parse(caption), layout.height, layout.width, rng, self.images.codebook())
