"""LANTERN (Jang et al., ICLR 2025) and LANTERN++ (Park et al., 2025): EAGLE with a relaxed, lossy acceptance
test that credits a drafted image code with the target mass of its nearest codes in the VQ latent space
(docs/algorithms.md §7.3).

Both are `EagleDecoder`s (sjd.decoders.eagle): the same drafter, draft trees, target forward and commit; only
the per-node test changes, to `sjd.core.relaxed_rules.lantern_tree_rule`, which follows the released code
(jadohu/LANTERN). A code's neighbours are the other codes by L2 distance between VQ codebook vectors (the
model's `code_embeddings`), nearest first; c_j is the target mass of the first j + 1 of its first k
(`neighbours`), and the test credits x with c_J:
- `lantern`: EAGLE-2's dynamic tree with top-k children tested at q = 1: accept x iff u < p(x) + c_J, with
  J = max{j : c_j <= delta}. On a rejection p(x) is set to 0 and, if J exists, so are the first k + 1
  neighbours (k + 1, not J + 1: the released code's cut), then p is renormalised. Defaults: the released
  LlamaGen and Anole setting (59 tokens a forward, depth 4, top-10 children; k = 1000, delta = 0.1); its
  Lumina-mGPT setting has depth 5.
- `lantern_pp`: EAGLE-1's static tree, children drawn from q without replacement and tested by
  u * q_i(x) < p(x) + c_J, with LANTERN++'s multiplicative bound J = max{j : c_j <= (lam - 1) p(x)}. On a
  rejection with J, the first k + 1 neighbours are zeroed in q_i before p <- norm(max(p - q_i, 0))
  (`zero_neighbours_in: q`, the released code for LlamaGen and Anole, whose static tree is `naive_extend_57`),
  or in p (`p`, its Lumina-mGPT code, whose static tree is `mc_sim_7b_63`). Defaults: LlamaGen's tree and
  rule, with (k, lam) = (10, 5), the first of the released script's LANTERN++ settings.
The relaxed mass is read from the target left by the earlier siblings' rejections, as in the released code.
Both keys (`delta` or `lam`, `zero_neighbours_in`) are settings, so LANTERN's relaxation on the static tree
(the released `--static_tree` with delta <= 1) is `decoder=lantern decoder.tree=naive_extend_57
decoder.children=sampled decoder.zero_neighbours_in=q`.

Where we differ from the released code, in one place: when a rejection leaves no mass, it samples uniformly
from the whole vocabulary, which can write an id the image grammar forbids at that position; we sample
uniformly from the ids the grammar allows there (the free ids at a free position:
`sjd.core.relaxed_rules.grammar_fallback`).

Notes. A k beyond the codebook means all of it. The released Lumina-mGPT path also accepts a drafted syntax
token outright and rejects a non-image one; our grammar does both through p (a forced position is one-hot,
and a forced id has no neighbours). At temperature 0 the target is one-hot, so the relaxation sees none of
the softmax it reads in the released greedy path (the argmax of the relaxed probabilities), which is not
reproduced: a rejection there can empty the target and draw from the fallback. LANTERN is published, and run
here, at temperature 1.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

from sjd.core.relaxed_rules import CodeNeighbours, code_neighbours, lantern_tree_rule
from sjd.decoders.eagle import EagleDecoder
from sjd.models.base import ModelAdapter
from sjd.types import CODE_EMBEDDINGS

ZERO_IN = ("p", "q")


@dataclass(eq=False, kw_only=True)
class RelaxedTreeDecoder(EagleDecoder):
    """What LANTERN and LANTERN++ share: the neighbour table and the relaxed node test; `bound()` says which."""

    requires = EagleDecoder.requires | {CODE_EMBEDDINGS}
    lossless = False

    neighbours: int
    zero_neighbours_in: str

    def __post_init__(self) -> None:
        if self.neighbours < 0:
            raise ValueError(f"decoder.neighbours (LANTERN's k) must be >= 0, got {self.neighbours}")
        if self.zero_neighbours_in not in ZERO_IN:
            raise ValueError(f"decoder.zero_neighbours_in must be one of {ZERO_IN}, got {self.zero_neighbours_in!r}")
        super().__post_init__()
        self._tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> neighbours_of(model)

    def bound(self) -> dict:
        raise NotImplementedError

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        self.neighbours_of(adapter)  # built at start-up, not in the first timed generate()

    def neighbours_of(self, adapter: ModelAdapter) -> CodeNeighbours:
        """Each code's k + 1 nearest codes (the rejection zeroes k + 1), on the model's device. A function of
        this decoder's k and the model alone, so it is kept per model, for every call on it."""
        table = self._tables.get(adapter)
        if table is None:
            table = code_neighbours(adapter.code_embeddings(), adapter.layout.free_tokens, self.neighbours + 1)
            self._tables[adapter] = table
        return table

    def node_rule(self, adapter: ModelAdapter):
        return functools.partial(
            lantern_tree_rule,
            neighbours=self.neighbours_of(adapter),
            k=self.neighbours,
            zero_in=self.zero_neighbours_in,
            **self.bound(),
        )


@dataclass(eq=False, kw_only=True)
class LanternDecoder(RelaxedTreeDecoder):
    """LANTERN: the additive bound c_J <= delta, on EAGLE-2's dynamic tree by default."""

    name: str = "lantern"
    depth: int = 4
    total_tokens: int = 59
    neighbours: int = 1000
    delta: float = 0.1
    zero_neighbours_in: str = "p"

    def __post_init__(self) -> None:
        if not 0 <= self.delta <= 1:
            raise ValueError(
                f"decoder.delta must be in [0, 1], got {self.delta} (the released code reads a delta above 1 as "
                "LANTERN++'s lambda: use decoder=lantern_pp and decoder.lam)"
            )
        super().__post_init__()

    def bound(self) -> dict:
        return {"delta": self.delta}


@dataclass(eq=False, kw_only=True)
class LanternPPDecoder(RelaxedTreeDecoder):
    """LANTERN++: the multiplicative bound c_J <= (lam - 1) p(x), on EAGLE-1's static tree by default."""

    name: str = "lantern_pp"
    tree: str = "naive_extend_57"
    depth: int = 5
    total_tokens: int = 58
    children: str = "sampled"
    neighbours: int = 10
    lam: float = 5.0
    zero_neighbours_in: str = "q"

    def __post_init__(self) -> None:
        if self.lam < 1:
            raise ValueError(f"decoder.lam (LANTERN++'s lambda) must be >= 1, got {self.lam}")
        super().__post_init__()

    def bound(self) -> dict:
        return {"lam": self.lam}
