"""The engine on a real architecture: window forwards at each width and context, eager and compiled, against the
bandwidth floor, with what the compiled engine did (graphs, breaks, recompiles, CUDA-graph skips, inputs mutated
without a static address, cache reallocations).

The floor F of a forward is what it must read at the bandwidth: the linear weights, the head rows decoding needs
(the image codes') and every cache row's live KV (`floor_ms`, through sjd.core.cost's byte counts). A forward's
time over F says how far the engine is from the hardware; the eager engine's ratio is the published code's regime.

One stage of the device check (sjd.bench.gpu_check); on the CPU at tiny widths the same code runs in a test, where
the times mean nothing but every invariant of the compiled engine is checked as on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from sjd.bench.device_probe import LayerShapes, timed_ms
from sjd.core.cost import Architecture, forward_cost
from sjd.harness.engine_watch import counters_now
from sjd.models.base import ModelAdapter
from sjd.models.real_architectures import PROMPT
from sjd.types import ImageLayout

WRITE_CHUNK = 256  # tokens a forward while the context is written (bounds the logits' memory)


def architecture(shapes: LayerShapes, layers: int) -> Architecture:
    """The cost model's view of the timed model: its layers and the code head rows decoding reads."""
    return Architecture("timed", layers, shapes.hidden, shapes.intermediate, shapes.heads, shapes.kv_heads,
                        shapes.code_rows)  # fmt: skip


def floor_ms(arch: Architecture, rows: int, width: int, context: int, dtype: str, bandwidth_gbs: float) -> float:
    """F: the bytes one forward must read (weights, code head rows, `rows` cache rows' live KV) at `bandwidth_gbs`."""
    return forward_cost(arch, rows, width, context, dtype).bytes / (bandwidth_gbs * 1e6)


def random_stream(layout: ImageLayout, n: int, seed: int = 0) -> torch.Tensor:
    """[1, n] ids that obey the layout's grammar: forced tokens where forced, random free ids elsewhere."""
    g = torch.Generator().manual_seed(seed)
    free = layout.free_token_ids
    ids = free[torch.randint(len(free), (n,), generator=g)]
    forced = layout.forced[:n]
    return torch.where(forced >= 0, forced, ids)[None]


def write_context(adapter: ModelAdapter, stream: torch.Tensor, context: int) -> None:
    """Prefill the check's prompt and write the first `context` tokens of `stream`."""
    adapter.prefill([PROMPT], with_uncond=True)
    with adapter.eagerly():  # wide chunks through the eager stack: no graph compiled for a chunk's width
        for s in range(0, context, WRITE_CHUNK):
            adapter.forward(stream[:, s : min(s + WRITE_CHUNK, context)], [s])


def kernels_per_call(device: torch.device, fn) -> int | None:
    """CUDA kernels the profiler sees in one call of `fn` (a CUDA graph's replay may show as one); None off CUDA."""
    if device.type != "cuda":
        return None
    fn()
    torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize(device)
    return int(sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA))


@contextlib.contextmanager
def inductor_graphs() -> Iterator[list]:
    """Every graph inductor compiles inside the block, compiled afresh (its caches off), as
    (mutated input indices, static input indices). An input a graph writes in place without a static address is
    what makes inductor skip CUDA graphs ("mutated inputs"); on the CPU inductor never gets to that check, so this
    is how a CPU run sees it."""
    import torch._inductor.output_code as output_code

    seen: list[tuple[list[int], list[int]]] = []
    original = output_code.CompiledFxGraph.__init__

    def recording(self, *args, **kwargs):
        original(self, *args, **kwargs)
        static = (getattr(self, "fx_kwargs", None) or {}).get("static_input_idxs") or []
        seen.append((sorted(self.mutated_input_idxs), sorted(static)))

    output_code.CompiledFxGraph.__init__ = recording
    try:
        with (
            torch._inductor.config.patch(fx_graph_cache=False),
            torch._functorch.config.patch(enable_autograd_cache=False),
        ):
            yield seen
    finally:
        output_code.CompiledFxGraph.__init__ = original


def engine_forwards(
    adapter: ModelAdapter,
    compiled: bool,
    mode: str | None,
    contexts: list[int],
    windows: list[int],
    repeats: int,
) -> dict:
    """Median ms of `forward(W tokens, start=context)` (then `truncate`) for each context and width W, batch 1 with
    its CFG row, on the eager engine (dynamic cache) or the compiled one (static cache, `mode`). The first call of a
    width compiles (its seconds are `compile_s`); a graph compiled after that is a recompile. The context is
    written afresh (a new prefill) for each context, so the static cache meets a second prompt: its storage must
    not move (`cache_reallocations`, `cache_moved`)."""
    device = adapter.device
    adapter.uncompile()
    adapter.use_cache("static" if compiled else "dynamic")
    if compiled:
        adapter.compile_windows(mode)
    stream = random_stream(adapter.layout, max(contexts) + max(windows)).to(device)
    rows, compile_s, kernels = [], {}, {}
    before = counters_now(adapter)
    warm = None
    addresses = None
    with inductor_graphs() as graphs:
        for i, context in enumerate(contexts):
            write_context(adapter, stream, context)
            if compiled and addresses is None:
                addresses = adapter.kv_storage.addresses()
            for w in windows:
                tokens = stream[:, context : context + w]

                def call(tokens=tokens, context=context):
                    adapter.forward(tokens, [context])
                    adapter.truncate([context])

                if i == 0:  # the first call of each width compiles
                    compile_s[w] = timed_ms(device, call, repeats=1, warmup=0) / 1000
                if i == 0 and w == windows[-1]:
                    warm = counters_now(adapter)
                rows.append({"context": context, "window": w, "ms": round(timed_ms(device, call, repeats), 4)})
                if i == 0:
                    kernels[w] = kernels_per_call(device, call)
    end = counters_now(adapter)
    warm = warm or before
    mutated = sum(len(set(m) - set(s)) for m, s in graphs)
    facts = {
        "graph_breaks": end["graph_breaks"] - before["graph_breaks"],
        "recompiles_after_warmup": end["graphs"] - warm["graphs"],
        "cudagraph_skips": end["cudagraph_skips"] - before["cudagraph_skips"] if device.type == "cuda" else None,
        "cache_reallocations": end["cache_allocations"] - warm["cache_allocations"],
        "cache_moved": bool(compiled and addresses != adapter.kv_storage.addresses()),
        "graphs_compiled": end["graphs"] - before["graphs"],
        "mutated_non_static_inputs": mutated if compiled else None,
    }
    adapter.uncompile()
    adapter.use_cache("dynamic")
    return {"forwards": rows, "compile_s": {str(w): round(s, 2) for w, s in compile_s.items()},
            "kernels_per_forward": {str(w): k for w, k in kernels.items()}, **facts}  # fmt: skip
