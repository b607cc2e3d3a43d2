"""Procedural captioned scenes for the toy text-to-image model.

A scene is a 12x12 grid of codebook cells: a textured background colour and one to three
shapes (circle, square, triangle) of a colour, a size and a region of the image, each with a
texture of its own. Textures are drawn per cell, so images are not trivially predictable:
a decoder that is fast on this data is not fast because the next token is obvious.

Everything is generated from an integer seed with numpy's PCG64, so the data set is
reproducible without shipping any images.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRID = 12
COLOURS = ("red", "green", "blue", "yellow", "purple", "orange", "white", "black")
PATTERNS = ("solid", "dots", "hstripes", "vstripes")
SHAPES = ("circle", "square", "triangle")
SIZES = {"small": 1.7, "large": 2.8}  # radius in cells
# Region name -> (row, col) centre in cells; captions say where each object is.
REGIONS = {
    "top left": (2.5, 2.5),
    "top": (2.5, 6.0),
    "top right": (2.5, 9.5),
    "left": (6.0, 2.5),
    "center": (6.0, 6.0),
    "right": (6.0, 9.5),
    "bottom left": (9.5, 2.5),
    "bottom": (9.5, 6.0),
    "bottom right": (9.5, 9.5),
}


def code_of(colour: int, pattern: int) -> int:
    """Codebook index of a (colour, pattern) cell."""
    return colour * len(PATTERNS) + pattern


@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str
    size: str
    region: str

    def caption(self) -> str:
        return f"{self.size} {self.colour} {self.shape} {self.region}"


@dataclass(frozen=True)
class Scene:
    background: str
    objects: tuple[SceneObject, ...]
    codes: np.ndarray  # [GRID, GRID] codebook indices

    @property
    def caption(self) -> str:
        parts = " and ".join(o.caption() for o in self.objects)
        return f"{parts} on {self.background}"


def _covers(shape: str, radius: float, dy: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """Which cells (offsets dy, dx from the centre, in cells) a shape covers."""
    if shape == "circle":
        return dy**2 + dx**2 <= radius**2
    if shape == "square":
        return np.maximum(np.abs(dy), np.abs(dx)) <= 0.8 * radius
    # Triangle with its apex up: half-width grows linearly from the apex to the base.
    inside_rows = np.abs(dy) <= radius
    return inside_rows & (np.abs(dx) <= (dy + radius) / 2.0)


def sample_scene(rng: np.random.Generator, n_objects: int | None = None) -> Scene:
    """Draw one scene: background texture, then objects painted in caption order."""
    bg = int(rng.integers(len(COLOURS)))
    # Background noise: each image mixes two textures of its colour in its own proportion.
    bg_patterns = rng.choice(len(PATTERNS), size=2, replace=False)
    mix = rng.uniform(0.15, 0.45)
    pick = rng.random((GRID, GRID)) < mix
    codes = np.where(pick, code_of(bg, bg_patterns[1]), code_of(bg, bg_patterns[0]))

    n = int(rng.integers(1, 4)) if n_objects is None else n_objects
    rows, cols = np.meshgrid(np.arange(GRID) + 0.5, np.arange(GRID) + 0.5, indexing="ij")
    regions = rng.choice(len(REGIONS), size=n, replace=False)
    objects = []
    for k in range(n):
        colour = int(rng.choice([c for c in range(len(COLOURS)) if c != bg]))
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        size = ("small", "large")[int(rng.integers(2))]
        region = list(REGIONS)[int(regions[k])]
        cy, cx = REGIONS[region]
        cy += rng.uniform(-0.6, 0.6)
        cx += rng.uniform(-0.6, 0.6)
        mask = _covers(shape, SIZES[size], rows - cy, cols - cx)
        pattern = int(rng.integers(len(PATTERNS)))
        # Most cells of an object share its texture; a few are solid, as noise.
        cell_pattern = np.where(rng.random((GRID, GRID)) < 0.85, pattern, 0)
        codes = np.where(mask, colour * len(PATTERNS) + cell_pattern, codes)
        objects.append(SceneObject(shape, COLOURS[colour], size, region))
    return Scene(COLOURS[bg], tuple(objects), codes.astype(np.int64))


def scene_batch(seed: int, index: int, batch_size: int) -> list[Scene]:
    """The `index`-th batch of the data set defined by `seed` (independent of other batches)."""
    rng = np.random.Generator(np.random.PCG64([seed, index]))
    return [sample_scene(rng) for _ in range(batch_size)]


def caption_words() -> list[str]:
    """Every word a caption can contain, in a fixed order (the toy text vocabulary)."""
    words = ["and", "on", *SIZES, *COLOURS, *SHAPES]
    for region in REGIONS:
        words += [w for w in region.split() if w not in words]
    return words
