"""The static cache's keys and values (sjd/models/static_cache.py, KVStorage): allocated at the first prefill and
reused by every later prompt of a run (their addresses never change, as a CUDA graph that writes them needs), grown
only when a prompt needs more rows or slots than any before, and marked static for torch.compile; and the compiled
window's outputs cloned out of a CUDA graph's memory (KeptOutputs)."""

import torch

from sjd.bench.bookkeeping import build_model
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.prompts import load_prompt_file
from sjd.models.causal_lm import KeptOutputs

PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:4]


def test_every_prompt_of_a_run_decodes_into_the_same_storage():
    adapter, sampling = build_model("toy")
    adapter.use_cache("static")
    addresses = []
    with torch.no_grad():
        for i, decoder in enumerate([ARDecoder(), SJDDecoder(window=16), ARDecoder(), SJDDecoder(window=16)]):
            batch = PROMPTS[i % 2 * 2 : i % 2 * 2 + 2]  # two batches of two prompts, each decoded twice
            decoder.generate(adapter, batch, sampling, make_generators(0, [p.prompt_id for p in batch], "cpu"))
            addresses.append(adapter.kv_storage.addresses())
    layers = len(adapter.kv_storage.layers)
    assert layers > 0 and all(a == addresses[0] for a in addresses)
    assert adapter.kv_storage.allocations == layers  # once a layer, at the first prefill
    keys = adapter.kv_storage.layers[0][0]
    assert getattr(adapter._cache.cache.layers[0].keys, "_dynamo_static_input_type", None) == "unguarded"
    assert adapter._cache.cache.layers[0].keys.data_ptr() == keys.data_ptr()  # a view of the storage


def test_a_prompt_with_more_rows_grows_the_storage_once_and_a_smaller_one_reuses_it():
    adapter, sampling = build_model("toy")
    adapter.use_cache("static")
    with torch.no_grad():
        for batch in (PROMPTS[:1], PROMPTS[:3], PROMPTS[:2]):
            gens = make_generators(0, [p.prompt_id for p in batch], "cpu")
            ARDecoder().generate(adapter, batch, sampling, gens)
    layers = len(adapter.kv_storage.layers)
    assert adapter.kv_storage.allocations == 2 * layers  # the first prompt, then three rows: never for two
    assert adapter.kv_storage.layers[0][0].shape[0] == 6  # three prompts and their CFG rows


def test_a_compiled_windows_outputs_leave_the_graphs_memory_as_copies():
    kept_in_graph = torch.arange(6.0)

    class Replay(torch.nn.Module):  # what a CUDA graph replay returns: the same memory every call
        def forward(self, x):
            kept_in_graph.add_(x)
            return {"hidden": kept_in_graph, "n": 3}

    out = KeptOutputs(Replay())(torch.ones(6))
    assert torch.equal(out["hidden"], kept_in_graph) and out["hidden"].data_ptr() != kept_in_graph.data_ptr()
    assert out["n"] == 3
