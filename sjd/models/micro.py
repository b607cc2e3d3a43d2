"""A micro text-to-image model whose whole output space can be enumerated (for the audit).

A randomly initialised Llama (seeded) over a handful of ids: specials, two caption words,
`n_codes` image codes and the Lumina-style grammar (begin-of-image, end-of-line after every
row, end-of-image). With a 2x2 grid of 3 codes there are 81 images, so the exact AR
distribution is computable and a decoder's samples can be tested against it. The output
head is scaled so that distributions are far from uniform, and CFG changes them. Its SJD2 variant
(the noise-aware input path) is sjd.sjd2.micro.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sjd.models.causal_lm import CausalLMAdapter
from sjd.types import CODE_EMBEDDINGS, CUSTOM_MASK, FEATURES, WINDOW, ImageLayout, Prompt

PAD, BOS, NULL, WORD_A, WORD_B = 0, 1, 2, 3, 4
FIRST_CODE = 5


class MicroAdapter(CausalLMAdapter):
    capabilities = frozenset({WINDOW, CUSTOM_MASK, CODE_EMBEDDINGS, FEATURES})

    def __init__(
        self,
        height: int = 2,
        width: int = 2,
        n_codes: int = 3,
        seed: int = 0,
        logit_scale: float = 6.0,
        device: str = "cpu",
        name: str = "micro",
    ) -> None:
        self.name, self.device = name, torch.device(device)
        self.height, self.width, self.n_codes = height, width, n_codes
        self.boi = FIRST_CODE + n_codes
        self.eol, self.eoi = self.boi + 1, self.boi + 2
        vocab = self.eoi + 1
        torch.manual_seed(seed)
        config = LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=64,
        )
        self.model = LlamaForCausalLM(config).eval().to(self.device)
        with torch.no_grad():
            self.model.lm_head.weight.mul_(logit_scale)
        self.layout = self._layout(vocab)

    def _layout(self, vocab: int) -> ImageLayout:
        n = 1 + self.height * (self.width + 1) + 1
        forced = torch.full((n,), -1, dtype=torch.long)
        forced[0], forced[-1] = self.boi, self.eoi
        for r in range(self.height):
            forced[1 + r * (self.width + 1) + self.width] = self.eol
        free = torch.zeros(vocab, dtype=torch.bool)
        free[FIRST_CODE : FIRST_CODE + self.n_codes] = True
        return ImageLayout(n, self.height, self.width, self.width + 1, 1, forced, free, vocab)

    def prompt_ids(self, prompts: Sequence[Prompt], with_uncond: bool) -> torch.Tensor:
        # Two prompts only: "a" and anything else ("b"); the unconditional row is NULL.
        rows = [[BOS, WORD_A if p.text.strip() == "a" else WORD_B] for p in prompts]
        if with_uncond:
            rows += [[BOS, NULL]] * len(prompts)
        return torch.tensor(rows, dtype=torch.long)

    def decode_images(self, tokens: torch.Tensor) -> np.ndarray:
        """Each code becomes a grey level; enough to look at, nothing depends on it."""
        codes = self.codes(tokens).numpy()
        grey = (255 * codes / max(self.n_codes - 1, 1)).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=-1)

    def code_embeddings(self) -> torch.Tensor:
        """A code's grey level (what decode_images draws): codes 0 and 1 are neighbours, 0 and 2 are not."""
        table = torch.zeros(self.layout.vocab_size, 1)
        table[FIRST_CODE : FIRST_CODE + self.n_codes, 0] = torch.arange(self.n_codes) / max(self.n_codes - 1, 1)
        return table.to(self.device)

    def codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """[B, n_tokens] -> [B, height, width] code indices."""
        body = tokens[:, 1 : 1 + self.height * (self.width + 1)].reshape(-1, self.height, self.width + 1)
        return (body[..., : self.width] - FIRST_CODE).cpu()
