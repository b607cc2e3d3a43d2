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

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sjd.core.relaxed_rules import (
    gsd_masses,
    gsd_rejection,
    lantern_masses,
    lantern_rejection,
    neighbour_table,
    relaxed_verify,
)
from sjd.core.sampling import SamplingConfig
from sjd.core.verify import VerifyResult
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.window import WindowCall, WindowStep
from sjd.models.base import ModelAdapter
from sjd.types import CODE_EMBEDDINGS, WINDOW

RULES = ("gsd", "lantern")


@dataclass(eq=False, kw_only=True)
class RelaxedSJDDecoder(SJDDecoder):
    requires = frozenset({WINDOW, CODE_EMBEDDINGS})
    lossless = False
    verifications = ("relaxed",)

    name: str = "gsd"
    acceptance: str = "gsd"
    neighbours: int = 3
    p_tol: float = 0.15
    rank_radius: int = 7
    delta: float = 0.1
    verification: str = field(default="relaxed", init=False)  # recorded with the results: `acceptance` decides

    def __post_init__(self) -> None:
        if self.acceptance not in RULES:
            raise ValueError(f"decoder.acceptance must be one of {RULES}, got {self.acceptance!r}")
        if self.neighbours < 1 or self.rank_radius < 0 or self.p_tol < 0 or self.delta < 0:
            raise ValueError(
                "decoder.neighbours must be >= 1 and decoder.rank_radius, decoder.p_tol, decoder.delta >= 0, "
                f"got {self.neighbours}, {self.rank_radius}, {self.p_tol}, {self.delta}"
            )
        super().__post_init__()
        self._tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> neighbours_of(model)

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        self.neighbours_of(adapter)  # built at start-up, not in the first timed generate()

    def neighbours_of(self, adapter: ModelAdapter) -> torch.Tensor:
        """[V, neighbours] each code's nearest codes in the model's latent space. A function of this
        decoder's settings and the model alone, so it is kept per model, for every call on it."""
        table = self._tables.get(adapter)
        if table is None:
            table = neighbour_table(adapter.code_embeddings(), adapter.layout.free_tokens, self.neighbours)
            table = self._tables[adapter] = table.to(adapter.device)  # on the device once, not once a decode
        return table

    def new_call(
        self, adapter: ModelAdapter, sampling: SamplingConfig, generators: Sequence[torch.Generator]
    ) -> RelaxedCall:
        call = super().new_call(adapter, sampling, generators)
        return RelaxedCall(**vars(call), neighbours=self.neighbours_of(adapter))

    def accept(self, step: WindowStep, accept_uniforms: torch.Tensor, sample_uniforms: torch.Tensor) -> VerifyResult:
        p, drafts, q = step.p, step.drafts, step.q
        table = step.call.neighbours
        if self.acceptance == "gsd":
            target, draft, _ = gsd_masses(p, q, drafts, table, self.p_tol, self.rank_radius)
            on_reject = gsd_rejection(p, q)
        else:
            target, draft, credited = lantern_masses(p, q, drafts, table, self.delta)
            on_reject = lantern_rejection(p, drafts, table, credited)
        return relaxed_verify(p, drafts, q, step.n_drafts, accept_uniforms, sample_uniforms, target, draft, on_reject)


@dataclass
class RelaxedCall(WindowCall):
    """A relaxed decoder's call: the latent neighbours its rule credits, on the model's device."""

    neighbours: torch.Tensor
