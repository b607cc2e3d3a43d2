"""What the compiled engine did, as a run records it (sjd/harness/engine_watch.py): graphs compiled after the
warm-up and static cache reallocations counted, and with compile_strict a recompile after the warm-up an error where
dynamo meets it. On dynamo's aot_eager backend: the same graphs as inductor's, compiled in a fraction of a second."""

import pytest
import torch

from sjd.bench.bookkeeping import build_model
from sjd.harness.engine_watch import EngineError, EngineWatch


def step(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sum(-1)


def test_a_shape_the_warm_up_did_not_meet_is_counted_and_under_compile_strict_is_an_error():
    adapter, _ = build_model("micro")
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", dynamic=False)
    watch = EngineWatch(adapter)
    compiled(torch.ones(2, 3))  # the warm-up compiles this shape
    watch.warmed_up()
    with watch.timed():
        compiled(torch.ones(2, 3))
        compiled(torch.ones(2, 5))  # a shape the warm-up never met: a new graph while timing
    assert watch.facts()["graphs_compiled_timed"] == 1

    strict = EngineWatch(adapter, strict=True)
    compiled(torch.ones(2, 3))
    strict.warmed_up()
    with pytest.raises(Exception, match="[Rr]ecompil"), strict.timed():
        compiled(torch.ones(4, 7))
    assert not torch._dynamo.config.error_on_recompile  # put back after the timed block


def test_strict_facts_name_what_fell_short():
    with pytest.raises(EngineError, match=r"while timing: \{'cache_reallocations': 1\}"):
        EngineWatch.check({"graph_breaks": 0, "cache_reallocations": 1}, after_warmup=True)
