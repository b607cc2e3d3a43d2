"""Adapter for the shipped toy text-to-image model (sjd/assets/toy).

CFG: the unconditional row is the NULL caption padded to the same text context, the same
construction the model was trained with (caption dropout), so conditional and unconditional
rows have identical lengths and positions and run as one batched forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from sjd.models.causal_lm import CausalLMAdapter
from sjd.toy.model import load_toy
from sjd.toy.scenes import GRID
from sjd.toy.tokenizer import CODEBOOK, N_CODES, N_IMAGE_TOKENS, ToyVocab, decode_codes
from sjd.types import CODE_EMBEDDINGS, CUSTOM_MASK, FEATURES, WINDOW, ImageLayout, Prompt

DEFAULT_WEIGHTS = Path(__file__).resolve().parents[1] / "assets" / "toy"


def toy_layout(vocab: ToyVocab) -> ImageLayout:
    forced = torch.full((N_IMAGE_TOKENS,), -1, dtype=torch.long)
    forced[0] = vocab.boi
    for row in range(GRID):
        forced[1 + row * (GRID + 1) + GRID] = vocab.eol
    forced[-1] = vocab.eoi
    free = torch.zeros(vocab.size, dtype=torch.bool)
    free[vocab.code_offset : vocab.boi] = True
    return ImageLayout(
        n_tokens=N_IMAGE_TOKENS,
        height=GRID,
        width=GRID,
        row_stride=GRID + 1,
        first_code=1,
        forced=forced,
        free_tokens=free,
        vocab_size=vocab.size,
    )


class ToyAdapter(CausalLMAdapter):
    capabilities = frozenset({WINDOW, CUSTOM_MASK, CODE_EMBEDDINGS, FEATURES})

    def __init__(self, weights: str | None = None, device: str = "cpu", name: str = "toy") -> None:
        self.name = name
        self.device = torch.device(device)
        path = Path(weights) if weights else DEFAULT_WEIGHTS
        self.model, self.meta = load_toy(path, config_key="model.adapter.weights", name=name)
        self.model.to(self.device)
        self.vocab = ToyVocab()
        self.text_context = int(self.meta["text_context"])
        self.layout = toy_layout(self.vocab)

    def check_prompts(self, prompts: Sequence[Prompt]) -> None:
        for p in prompts:
            self.vocab.encode_text(p.text, self.text_context, p.prompt_id)

    def prompt_ids(self, prompts: Sequence[Prompt], with_uncond: bool) -> torch.Tensor:
        rows = [self.vocab.encode_text(p.text, self.text_context, p.prompt_id) for p in prompts]
        if with_uncond:
            rows += [self.vocab.null_text(self.text_context)] * len(prompts)
        return torch.tensor(rows, dtype=torch.long)

    def decode_images(self, tokens: torch.Tensor) -> np.ndarray:
        return decode_codes(self.vocab.codes_from_sequence(tokens))

    def code_embeddings(self) -> torch.Tensor:
        """Each code's codebook patch (pixels / 255, flattened): the toy's VQ latent."""
        table = torch.zeros(self.layout.vocab_size, CODEBOOK[0].size)
        first = self.vocab.code_offset
        table[first : first + N_CODES] = torch.as_tensor(CODEBOOK.reshape(N_CODES, -1) / 255.0, dtype=torch.float32)
        return table.to(self.device)
