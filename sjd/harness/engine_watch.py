"""What the compiled engine did during a run: graphs, graph breaks, CUDA-graph skips, recompiles after the warm-up
and reallocations of the static cache.

A compiled run is only the engine it claims to be if every window and kernel ran as one graph, recorded as a CUDA
graph on a GPU, compiled in the warm-up and never again, on a KV cache allocated once. torch reports each failure
quietly (a skip is a log line, a recompile past the limit falls back to eager), so `EngineWatch` reads torch's own
counters around a run and puts them in the summary rows (`engine_facts`); with `compile_strict=true` any of them is
an error instead: a CUDA-graph skip raises where inductor decides it (`cudagraph_or_error`), a recompile after the
warm-up raises where dynamo would recompile, and a graph break or a reallocated cache raises after the warm-up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from sjd.models.base import ModelAdapter


def counters_now(adapter: ModelAdapter | None = None) -> dict[str, int]:
    """torch's compile counters so far in this process, and the static cache's allocations."""
    from torch._dynamo.utils import counters

    storage = getattr(adapter, "_kv_storage", None)
    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
        "cache_allocations": 0 if storage is None else storage.allocations,
    }


class EngineError(RuntimeError):
    """The compiled engine is not what it claims to be (compile_strict)."""


@dataclass
class EngineWatch:
    """Counters at the start of a run and after its warm-up; `facts()` the differences."""

    adapter: ModelAdapter
    strict: bool = False
    start: dict[str, int] = field(default_factory=dict)
    warm: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.start = counters_now(self.adapter)
        if self.strict:
            torch._inductor.config.triton.cudagraph_or_error = True  # a skip raises where inductor decides it

    def warmed_up(self) -> None:
        """Call after the warm-up; strict: a graph break or a CUDA-graph skip there is an error now."""
        self.warm = counters_now(self.adapter)
        if self.strict:
            self.check(self.facts_between(self.start, self.warm), after_warmup=False)

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Around the timed batches; strict: a recompile raises as dynamo meets it."""
        patch = torch._dynamo.config.patch(error_on_recompile=True) if self.strict else contextlib.nullcontext()
        with patch:
            yield

    def facts(self) -> dict[str, int]:
        """For the summary rows: over the whole run, graph breaks and CUDA-graph skips; after the warm-up, graphs
        compiled (`graphs_compiled_timed`: a recompile or a shape the warm-up did not meet) and static cache
        reallocations (`cache_reallocations`)."""
        end = counters_now(self.adapter)
        facts = self.facts_between(self.start, end)
        warm = self.warm or self.start
        facts["graphs_compiled_timed"] = end["graphs"] - warm["graphs"]
        facts["cache_reallocations"] = end["cache_allocations"] - warm["cache_allocations"]
        if self.strict:
            self.check(facts, after_warmup=True)
        return facts

    @staticmethod
    def facts_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
        return {k: after[k] - before[k] for k in ("graph_breaks", "cudagraph_skips")}

    @staticmethod
    def check(facts: dict[str, int], after_warmup: bool) -> None:
        bad = {k: v for k, v in facts.items() if v}
        if bad:
            when = "while timing" if after_warmup else "in the warm-up"
            raise EngineError(f"compile_strict: the compiled engine fell short {when}: {bad}")
