"""Procedural images as VQ codes: what the stand-in models learn to draw.

An image is a smooth colour field: two colours named by the caption, mixed by a soft mask of
random low-frequency waves (regions with soft edges, like objects on a background), each pixel
then jittered by Gaussian texture noise of standard deviation `noise`. A fixed random codebook
(`n_codes` colours drawn uniformly from the unit cube, seeded) quantises each jittered pixel to
its nearest code, as a VQ tokenizer would. So the codes' statistics are noisy (the texture
noise sets how many codes a pixel can become, hence the model's per-token entropy), while their
layout has spatial structure a model can only predict from the codes around a position: the
field, the region edges and the caption's colours. An optional streak texture, correlated along
each row, makes the codes just to the left of a position more informative than the row above; an
optional column streak, correlated down each column, makes the code just above informative too (a
real image's texture depends on both, and a window that spans two rows then holds uncommitted codes
that the second row's codes depend on). An optional tint shifts each of an image's two colours by its
own random offset, and a row tint each row: the caption does not say them, so a model estimates them
from every code it has seen of that colour or row, and each code then moves the predictions of all
the codes after it a little (long-range, weak dependence, as a real model's on its context).

Captions name the two colours and the texture: "a rippled red field with blue patches".
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

import numpy as np

COLOURS = {
    "red": (0.8, 0.2, 0.2),
    "green": (0.2, 0.7, 0.3),
    "blue": (0.2, 0.3, 0.8),
    "yellow": (0.85, 0.8, 0.25),
    "purple": (0.55, 0.25, 0.7),
    "orange": (0.9, 0.55, 0.15),
    "teal": (0.2, 0.65, 0.65),
    "gray": (0.5, 0.5, 0.5),
}
TEXTURES = {"smooth": 1, "rippled": 2, "busy": 4}  # the highest wave frequency, in cycles per image


@dataclass(frozen=True)
class Theme:
    """What a caption fixes: the two colours and the texture."""

    base: str
    patch: str
    texture: str

    @property
    def caption(self) -> str:
        return f"a {self.texture} {self.base} field with {self.patch} patches"

    @classmethod
    def parse(cls, caption: str) -> Theme:
        words = caption.split()
        if len(words) != 7 or words[0] != "a" or words[2] not in COLOURS or words[5] not in COLOURS:
            want = "'a <texture> <colour> field with <colour> patches'"
            raise ValueError(f"not a stand-in caption (want {want}): {caption!r}")
        if words[1] not in TEXTURES:
            raise ValueError(f"unknown texture {words[1]!r} in {caption!r}; one of {sorted(TEXTURES)}")
        return cls(words[2], words[5], words[1])


def all_themes() -> list[Theme]:
    """Every caption the grammar makes (the two colours differ): 8 x 7 x 3 = 168."""
    return [Theme(b, p, t) for t in TEXTURES for b, p in itertools.permutations(COLOURS, 2)]


@dataclass(frozen=True)
class ProceduralImages:
    """The image distribution; `codebook_seed` fixes the VQ codebook, `noise` the texture."""

    n_codes: int = 8192
    noise: float = 0.04
    codebook_seed: int = 0
    streak: float = 0.0  # std of a texture component correlated along each row (0 = none)
    streak_corr: float = 0.85  # its correlation from one code to the next in the row (an AR(1) process)
    vstreak: float = 0.0  # std of a component correlated down each column, with the same correlation (0 = none)
    n_waves: int = 3
    edge: float = 6.0  # sharpness of the region mask: tanh(edge * waves)
    tint: float = 0.0  # std of a random offset of each of the image's two colours, per image (0 = none)
    row_tint: float = 0.0  # std of a random offset of each row's colours (0 = none)

    def codebook(self) -> np.ndarray:
        """[n_codes, 3] code colours in the unit cube."""
        return np.random.default_rng(self.codebook_seed).random((self.n_codes, 3)).astype(np.float32)

    def field(self, theme: Theme, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
        """[height, width, 3] the smooth colour field of one image."""
        top = TEXTURES[theme.texture]
        r = np.arange(height)[:, None] / height
        c = np.arange(width)[None, :] / width
        waves = np.zeros((height, width))
        for _ in range(self.n_waves):
            u, v = rng.integers(-top, top + 1, size=2)
            if u == 0 and v == 0:
                u = 1
            waves += rng.normal() * np.cos(2 * np.pi * (u * r + v * c) + rng.uniform(0, 2 * np.pi))
        mask = 0.5 + 0.5 * np.tanh(self.edge * waves / np.sqrt(self.n_waves) - rng.normal(0.5, 0.3))
        base, patch = np.array(COLOURS[theme.base]), np.array(COLOURS[theme.patch])
        if self.tint > 0:  # what this image's colours are, beyond the caption's names for them
            base, patch = base + rng.normal(0.0, self.tint, 3), patch + rng.normal(0.0, self.tint, 3)
        shade = 0.08 * np.cos(2 * np.pi * (r * rng.normal() + c * rng.normal()) + rng.uniform(0, 2 * np.pi))
        rows = rng.normal(0.0, self.row_tint, (height, 1, 3)) if self.row_tint > 0 else 0.0
        return np.clip(base + mask[..., None] * (patch - base) + shade[..., None] + rows, 0.0, 1.0)

    def sample(
        self, theme: Theme, height: int, width: int, rng: np.random.Generator, codebook: np.ndarray
    ) -> np.ndarray:
        """[height, width] code indices of one image: field + texture noise, nearest code."""
        pixels = self.field(theme, height, width, rng) + rng.normal(0.0, self.noise, (height, width, 3))
        if self.streak > 0:  # row-wise AR(1) texture: what the codes to the left predict and the row above does not
            pixels += ar1_texture(rng.normal(0.0, self.streak, (height, width, 3)), self.streak_corr)
        if self.vstreak > 0:  # column-wise AR(1): what the code above predicts
            columns = ar1_texture(rng.normal(0.0, self.vstreak, (width, height, 3)), self.streak_corr)
            pixels += columns.transpose(1, 0, 2)
        return nearest_code(pixels.reshape(-1, 3), codebook).reshape(height, width)


def ar1_texture(shocks: np.ndarray, rho: float) -> np.ndarray:
    """An AR(1) process along axis 1 of `shocks` [rows, length, 3], of the shocks' variance throughout."""
    out = np.empty_like(shocks)
    out[:, 0] = shocks[:, 0]
    for i in range(1, shocks.shape[1]):
        out[:, i] = rho * out[:, i - 1] + np.sqrt(1 - rho**2) * shocks[:, i]
    return out


# Every argument of a stand-in's recipe (scripts/train_standin.py) and its default; a checkpoint's training record
# holds them all (older records lack the later data knobs, whose defaults leave the images unchanged).
RECIPE_DEFAULTS = dict(family="lumina", resolution=512, noise=0.04, streak=0.0, streak_corr=0.85, vstreak=0.0,
                       edge=6.0, tint=0.0, row_tint=0.0, steps=200, batch_size=4, lr=3e-3, hidden=64, layers=2,
                       heads=4, seed=0, codebook_seed=0, threads=1)  # fmt: skip


def images_of(record: dict, n_codes: int) -> ProceduralImages:
    """The image distribution a training record names (its data knobs; the rest keep their defaults)."""
    knobs = {f.name: record[f.name] for f in fields(ProceduralImages) if f.name in record and f.name != "n_codes"}
    return ProceduralImages(n_codes=n_codes, **knobs)


def nearest_code(pixels: np.ndarray, codebook: np.ndarray) -> np.ndarray:
    """[N, 3] colours -> [N] index of the nearest codebook colour (what a VQ encoder does)."""
    import torch

    flat, book = torch.from_numpy(np.asarray(pixels, np.float32)), torch.from_numpy(codebook)
    return torch.cdist(flat, book).argmin(1).numpy()
