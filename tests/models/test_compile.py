"""compile=true: every decoder draws the same tokens with the compiled window forward and compiled iteration kernels
(the logits pipeline, verification, sampling: sjd.decoders.kernels), as the runner compiles them, as with the eager
ones.

The adapter contract holds each architecture's compiled windows to the eager logits with no graph break and no
recompile (test_compiled_windows_match_eager_with_no_graph_break_or_recompile). Here the decoders: on the toy,
sampled at a fixed seed (SJD2 on the noise-aware toy), every decoder config on the compiled forward against the
eager one on the same (static) cache. Compiling costs a few seconds a window width, so these are slow tests.

The same check on other models, outside CI (a stand-in's graphs take minutes to compile):
    SJD_COMPILE_MODELS=standin_lumina_512_cal python -m pytest tests/models/test_compile.py
runs every decoder config on each listed model, and the decoders that need a noise-aware model (SJD2) on the
toy's noise-aware variant. A model other than the toy decodes greedily (temperature 0): the compiled logits
differ from the eager ones in the last float32 bits (inductor fuses and reorders the sums), and over a stand-in's
thousand sampled tokens one of them can fall on the other side of a top-k cut or a uniform draw. The toy's
images are short enough that the sampled tokens agree, and they are what the test holds there.

Equal tokens alone would also pass if the compiled adapter quietly ran its windows eagerly. So hooks on the compiled
window stack (the torch.compile module, whose hooks run outside the graph) count the windows that go through it, and
the first window of each input shape must compile a graph (dynamo's `unique_graphs` counter): a decode that sends
no window through the compiled stack, or a shape that dynamo skips or gives up on, fails. Dynamo is also set to
raise rather than fall back to eager when a frame reaches its recompile limit; the settings are put back after the
module."""

import dataclasses
import os

import pytest
import torch
from decoder_on_model import fitted, resolved_decoder
from torch._dynamo.utils import counters

from sjd.bench.bookkeeping import build_model
from sjd.core.seeding import make_generators
from sjd.harness.decoder_configs import algorithm_configs
from sjd.harness.prompts import load_prompt_file
from sjd.types import EMBEDS

PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:2]
MODELS = os.environ.get("SJD_COMPILE_MODELS", "toy").split(",")  # the models every decoder config is decoded on
NOISE_AWARE = "toy_sjd2"  # for the decoders whose drafts are embeddings (SJD2)
SAMPLED = ("toy", NOISE_AWARE)  # decoded with their sampling settings; other models greedily
pytestmark = pytest.mark.slow


def graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    return int(counters["stats"]["unique_graphs"])


class CompiledWindows:
    """Watches the windows that go through compiled window stacks: how many since `start`, and the input shapes
    whose first window compiled no graph. Shapes are shared by every stack watched (two models of one
    architecture may share a graph), so a shape is judged on its first window in the module."""

    def __init__(self) -> None:
        self.shapes: dict[tuple, bool] = {}  # input shape -> whether its first window compiled a graph
        self.start()

    def start(self) -> None:
        self.windows, self.eager_shapes = 0, []

    def watch(self, stack: torch.nn.Module) -> None:
        stack.register_forward_pre_hook(self._before, with_kwargs=True)
        stack.register_forward_hook(self._after, with_kwargs=True)

    def _before(self, module, args, kwargs) -> None:
        self._graphs = graphs()

    def _after(self, module, args, kwargs, output) -> None:
        self.windows += 1
        shape = tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(kwargs.items()) if torch.is_tensor(v))
        if shape not in self.shapes:
            self.shapes[shape] = graphs() > self._graphs
            if not self.shapes[shape]:
                self.eager_shapes.append(shape)


@pytest.fixture(scope="module")
def engines():
    """Per model (the toy, and its noise-aware variant for SJD2): the model on the static cache, eager, and a
    second copy whose windows are compiled (once for the module: each window width compiles on first use); and
    the watch on the compiled windows. compile_windows raises dynamo's process-wide recompile limit: the patch
    puts it back, with the fail-on-limit setting, when the module is done. Dynamo starts as in a fresh process,
    as the adapter contract's compile test does: a graph an earlier test compiled for the same window stack and
    shape (the toy's contract test, run in this process before at one torch thread, as an xdist worker does)
    would otherwise serve this module's first window of that shape, which would count as compiling none."""
    torch._dynamo.reset()
    limit = torch._dynamo.config.recompile_limit
    with torch._dynamo.config.patch(recompile_limit=limit, fail_on_recompile_limit_hit=True):
        watch, out = CompiledWindows(), {}
        for model in (*MODELS, NOISE_AWARE):
            eager, sampling = build_model(model)
            eager.use_cache("static")
            compiled, _ = build_model(model)
            compiled.compile_windows(None)
            watch.watch(compiled._compiled)
            out[model] = (eager, compiled, sampling)
        yield out, watch


def decode(decoder, adapter, sampling) -> list:
    with torch.no_grad():
        out = decoder.generate(adapter, PROMPTS, sampling, make_generators(0, [p.prompt_id for p in PROMPTS], "cpu"))
    return [out.tokens.tolist(), out.n_forward, out.accepted]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", algorithm_configs())
def test_every_decoder_draws_the_same_tokens_compiled_as_eager(engines, name, model):
    engines, watch = engines
    decoder = resolved_decoder(name, model)
    on = NOISE_AWARE if EMBEDS in decoder.requires else model
    eager, compiled, sampling = engines[on]
    if on not in SAMPLED:
        sampling = dataclasses.replace(sampling, temperature=0.0)
    fitted(decoder, eager)
    compiled_decoder = resolved_decoder(name, model)
    fitted(compiled_decoder, compiled)
    compiled_decoder.compile_kernels(None)  # as the runner does under compile=true
    watch.start()
    assert decode(compiled_decoder, compiled, sampling) == decode(decoder, eager, sampling)
    assert compiled.compiled and watch.windows > 0, "no window went through the compiled forward"
    assert compiled_decoder.kernels.compiled, "the decoder's iteration kernels were not compiled"
    assert watch.eager_shapes == [], f"windows of these shapes compiled no graph: {watch.eager_shapes}"
