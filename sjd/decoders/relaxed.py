"""SJD with a relaxed acceptance rule (lossy comparators): GSD and a LANTERN-style rule.

The loop, drafts and Jacobi update are SJD's (sjd.decoders.sjd); only the test changes, to
one of the rules in sjd.core.relaxed_rules, which credit a draft with the target mass of its neighbours
in the image tokenizer's latent space. Not lossless: the audit reports the distance.

Choices (conf/decoder/gsd.yaml, conf/decoder/lantern.yaml):
- `neighbours`: how many nearest codes are candidates (GSD's group size G, LANTERN's k);
- GSD: `p_tol` (released code: 0.15) and `rank_radius` (released code: 7);
- LANTERN: `delta`, the total-variation budget of credited mass (LANTERN's default 0.1). The
  published LANTERN is EAGLE-style with a trained drafter; this is its acceptance rule on SJD's
  training-free drafts, so it says what the relaxation buys, not what LANTERN's drafter buys.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sjd.core.relaxed_rules import (
    gsd_masses,
    gsd_rejection,
    lantern_masses,
    lantern_rejection,
    neighbour_table,
    relaxed_verify,
)
from sjd.core.schedule import OFFICIAL_L
from sjd.core.verify import VerifyResult
from sjd.decoders.sjd import SJDDecoder, WindowState
from sjd.models.base import ModelAdapter
from sjd.types import CODE_EMBEDDINGS, WINDOW, ImageLayout

RULES = ("gsd", "lantern")


class RelaxedSJDDecoder(SJDDecoder):
    requires = frozenset({WINDOW, CODE_EMBEDDINGS})
    lossless = False

    def __init__(
        self,
        name: str = "gsd",
        window: int = 16,
        init: str = "random",
        acceptance: str = "gsd",
        neighbours: int = 3,
        p_tol: float = 0.15,
        rank_radius: int = 7,
        delta: float = 0.1,
        ar_prefix: int = 1,
        ar_suffix: int = 0,
        forced_drafts: bool = True,
        schedule: str = "harness",
        official_l: int = OFFICIAL_L,
    ) -> None:
        if acceptance not in RULES:
            raise ValueError(f"decoder.acceptance must be one of {RULES}, got {acceptance!r}")
        if neighbours < 1 or rank_radius < 0 or p_tol < 0 or delta < 0:
            raise ValueError(
                "decoder.neighbours must be >= 1 and decoder.rank_radius, decoder.p_tol, decoder.delta >= 0, "
                f"got {neighbours}, {rank_radius}, {p_tol}, {delta}"
            )
        super().__init__(
            name, window, init, ar_prefix, ar_suffix, forced_drafts, schedule=schedule, official_l=official_l
        )
        self.verification = "relaxed"  # recorded with the results: `acceptance` replaces SJD's rule
        self.acceptance, self.neighbours = acceptance, neighbours
        self.p_tol, self.rank_radius, self.delta = p_tol, rank_radius, delta

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        self._table = neighbour_table(adapter.code_embeddings(), adapter.layout.free_tokens, self.neighbours)

    def begin(self, state: WindowState, layout: ImageLayout, generators: Sequence[torch.Generator]) -> None:
        if not hasattr(self, "_table"):
            raise RuntimeError(f"decoder {self.name!r}: call check(adapter) before generate (it builds the neighbours)")
        self._table = self._table.to(state.tokens.device)

    def accept(
        self,
        p: torch.Tensor,
        drafts: torch.Tensor,
        q: torch.Tensor,
        n_drafts: torch.Tensor,
        accept_uniforms: torch.Tensor,
        sample_uniforms: torch.Tensor,
    ) -> VerifyResult:
        if self.acceptance == "gsd":
            target, draft, _ = gsd_masses(p, q, drafts, self._table, self.p_tol, self.rank_radius)
            on_reject = gsd_rejection(p, q)
        else:
            target, draft, credited = lantern_masses(p, q, drafts, self._table, self.delta)
            on_reject = lantern_rejection(p, drafts, self._table, credited)
        return relaxed_verify(p, drafts, q, n_drafts, accept_uniforms, sample_uniforms, target, draft, on_reject)
