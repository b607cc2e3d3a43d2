"""Forward-count studies of decoders on the shipped toy model (scripts/branch_study.py,
scripts/window_ceiling.py). They count forwards only, never time, so they can run next to other
work; a decoder's step compression is averaged over seeds because it moves a lot between them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from sjd.core.sampling import SamplingConfig
from sjd.decoders.base import Decoder, DecodeResult
from sjd.harness.prompts import load_prompt_file
from sjd.harness.provenance import make_generators
from sjd.models.toy import ToyAdapter
from sjd.types import Prompt

TOY_PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "prompts" / "toy.tsv"


@dataclass
class ToyStudy:
    adapter: ToyAdapter
    prompts: list[Prompt]
    sampling: SamplingConfig

    @classmethod
    def load(cls, n_prompts: int) -> ToyStudy:
        """The first n_prompts toy prompts, the toy's sampling (CFG 3, temperature 1), one thread."""
        torch.set_num_threads(1)
        return cls(ToyAdapter(), load_prompt_file(TOY_PROMPTS)[:n_prompts], SamplingConfig(cfg_scale=3.0))

    @property
    def n_tokens(self) -> int:
        return self.adapter.layout.n_tokens

    def runs(self, decoder: Decoder, seeds: int) -> Iterator[DecodeResult]:
        """All prompts in one batch, once per seed 0 .. seeds-1 (a prompt's tokens do not depend on its batch)."""
        for seed in range(seeds):
            gens = make_generators(seed, [p.prompt_id for p in self.prompts], self.adapter.device)
            yield decoder.generate(self.adapter, self.prompts, self.sampling, gens)

    def step_compression(self, result: DecodeResult) -> float:
        return self.n_tokens * len(self.prompts) / sum(result.n_forward)
