"""Tokenizers of the toy model: a word-level text vocabulary and a fixed patch codebook.

The image codebook has one entry per (colour, texture): each code renders a PATCH x PATCH
pixel patch, and `encode` maps any image back to the nearest code of each patch, so
`encode(decode(codes)) == codes`. The sequence layout follows Lumina-mGPT: a begin-of-image
token, GRID rows of GRID codes each closed by an end-of-line token, then end-of-image.
"""

from __future__ import annotations

import numpy as np
import torch

from sjd.toy.scenes import COLOURS, GRID, PATTERNS, caption_words

PATCH = 6  # pixels per code side; images are GRID * PATCH pixels square

# RGB of each palette colour; the darker shade is what textures mix in.
PALETTE = np.array(
    [
        [220, 40, 40],
        [40, 170, 60],
        [40, 80, 220],
        [235, 210, 40],
        [150, 60, 190],
        [245, 140, 30],
        [235, 235, 235],
        [30, 30, 30],
    ],
    dtype=np.float32,
)
SHADE = 0.55  # texture pixels are this fraction of the base colour (black gets lifted instead)


def _pattern_mask(pattern: str) -> np.ndarray:
    y, x = np.mgrid[0:PATCH, 0:PATCH]
    if pattern == "solid":
        return np.zeros((PATCH, PATCH), bool)
    if pattern == "dots":
        return (y % 3 == 1) & (x % 3 == 1)
    if pattern == "hstripes":
        return (y // 2) % 2 == 1
    return (x // 2) % 2 == 1  # vstripes


def _build_codebook() -> np.ndarray:
    """[n_codes, PATCH, PATCH, 3] float32 patches, code = colour * len(PATTERNS) + pattern."""
    patches = []
    for rgb in PALETTE:
        shade = rgb * SHADE if rgb.mean() > 60 else rgb + 90.0
        for pattern in PATTERNS:
            mask = _pattern_mask(pattern)[..., None]
            patches.append(np.where(mask, shade, rgb))
    return np.stack(patches).astype(np.float32)


CODEBOOK = _build_codebook()
N_CODES = len(CODEBOOK)


def decode_codes(codes: np.ndarray) -> np.ndarray:
    """[..., GRID, GRID] codes -> [..., GRID*PATCH, GRID*PATCH, 3] uint8 pixels."""
    patches = CODEBOOK[codes]  # [..., G, G, P, P, 3]
    *lead, g1, g2, p1, p2, c = patches.shape
    pixels = np.moveaxis(patches, -4, -3).reshape(*lead, g1 * p1, g2 * p2, c)
    return pixels.clip(0, 255).astype(np.uint8)


def encode_image(pixels: np.ndarray) -> np.ndarray:
    """[..., H, W, 3] uint8 pixels -> [..., H/PATCH, W/PATCH] nearest codes."""
    *lead, h, w, c = pixels.shape
    if h % PATCH or w % PATCH:
        raise ValueError(f"image size {h}x{w} is not a multiple of the patch size {PATCH}")
    patches = pixels.astype(np.float32).reshape(*lead, h // PATCH, PATCH, w // PATCH, PATCH, c)
    patches = np.moveaxis(patches, -3, -4).reshape(*lead, h // PATCH, w // PATCH, -1)
    dist = ((patches[..., None, :] - CODEBOOK.reshape(N_CODES, -1)) ** 2).sum(-1)
    return dist.argmin(-1)


def dominant_colours(pixels: np.ndarray) -> list[str]:
    """Palette colours of an image ordered by pixel count (shades count as their colour)."""
    flat = pixels.reshape(-1, 3).astype(np.float32)
    shaded = np.array([p * SHADE if p.mean() > 60 else p + 90.0 for p in PALETTE])
    refs = np.concatenate([PALETTE, shaded])
    nearest = ((flat[:, None] - refs[None]) ** 2).sum(-1).argmin(-1) % len(PALETTE)
    counts = np.bincount(nearest, minlength=len(PALETTE))
    return [COLOURS[i] for i in np.argsort(-counts, kind="stable") if counts[i] > 0]


class ToyVocab:
    """Token ids of the toy model: specials, caption words, image codes, image grammar."""

    PAD, BOS, NULL = 0, 1, 2  # NULL is the empty caption used for caption dropout / CFG

    def __init__(self) -> None:
        self.words = caption_words()
        self.word_to_id = {w: 3 + i for i, w in enumerate(self.words)}
        self.code_offset = 3 + len(self.words)
        self.boi = self.code_offset + N_CODES
        self.eol = self.boi + 1
        self.eoi = self.boi + 2
        self.size = self.boi + 3

    def encode_text(self, caption: str, context: int, prompt_id: str = "?") -> list[int]:
        """[BOS, words..., PAD...] of length `context`; errors name the prompt at fault."""
        words = caption.replace(",", " ").split()
        if not words:
            raise ValueError(f"prompt {prompt_id!r} is empty")
        unknown = sorted({w for w in words if w.lower() not in self.word_to_id})
        if unknown:
            raise ValueError(f"prompt {prompt_id!r} has words outside the toy model's vocabulary: {unknown}")
        if len(words) + 1 > context:
            raise ValueError(
                f"prompt {prompt_id!r} has {len(words)} words; the toy model's text context holds {context - 1}"
            )
        ids = [self.BOS] + [self.word_to_id[w.lower()] for w in words]
        return ids + [self.PAD] * (context - len(ids))

    def null_text(self, context: int) -> list[int]:
        return [self.BOS, self.NULL] + [self.PAD] * (context - 2)

    def image_sequence(self, codes: np.ndarray) -> list[int]:
        """[GRID, GRID] codes -> [BOI, row codes + EOL ..., EOI]."""
        seq = [self.boi]
        for row in codes:
            seq += [self.code_offset + int(c) for c in row] + [self.eol]
        return seq + [self.eoi]

    def codes_from_sequence(self, tokens: torch.Tensor) -> np.ndarray:
        """[B, n_tokens] generated ids -> [B, GRID, GRID] codes (grammar tokens dropped)."""
        body = tokens[:, 1 : 1 + GRID * (GRID + 1)].reshape(-1, GRID, GRID + 1)[..., :GRID]
        codes = (body - self.code_offset).clamp(0, N_CODES - 1)
        return codes.cpu().numpy()


N_IMAGE_TOKENS = 1 + GRID * (GRID + 1) + 1
