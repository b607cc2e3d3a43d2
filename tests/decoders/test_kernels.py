"""The iteration kernels (sjd.decoders.kernels): each compiles into one graph, gives the eager values, and the sync
counter prices each call as one graph replay.

That every decoder draws the same tokens with compiled kernels as with eager ones is held in
tests/models/test_compile.py, beside the compiled window forward, as the runner compiles both under compile=true."""

import functools

import pytest
import torch

from sjd.bench.bookkeeping import build_model, decoder_configs, entrants, model_config, prompt_batches
from sjd.bench.syncs import SyncCounter, count_decode
from sjd.core.sampling import SamplingConfig, sample_from
from sjd.core.seeding import make_generators
from sjd.decoders.kernels import EAGER, compiled_kernels
from sjd.decoders.sjd_pac import tree_tests
from sjd.models.causal_lm import RECOMPILE_LIMIT
from sjd.types import Logits


@pytest.fixture(scope="module")
def toy():
    return build_model("toy")


@pytest.fixture(scope="module", autouse=True)
def recompile_limit():
    """The limit a compiled run has (compiled_kernels raises it once a process; a module that ran before may have
    put it back, and the kernels' earlier graphs count toward it)."""
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        yield


def window(seed: int, B: int = 2, W: int = 6, V: int = 58) -> tuple:
    g = torch.Generator().manual_seed(seed)
    logits = Logits(torch.randn(B, W, V, generator=g), torch.randn(B, W, V, generator=g))
    q = torch.softmax(torch.randn(B, W - 1, V, generator=g), -1)
    drafts = sample_from(q, torch.rand(B, W - 1, generator=g))
    n_drafts = torch.tensor([W - 1, W - 3] * (B // 2))
    return logits, q, drafts, n_drafts, torch.rand(B, W - 1, generator=g), torch.rand(B, generator=g)


@pytest.mark.slow
def test_compiled_kernels_give_the_eager_values(toy):
    adapter, _ = toy
    layout = adapter.layout
    kernels = compiled_kernels(None)
    for seed, sampling in enumerate([SamplingConfig(3.0, 1.0, 20), SamplingConfig(1.0, 0.7, None, 0.9)]):
        logits, q, drafts, n_drafts, u_accept, u_final = window(seed)
        positions = torch.arange(6)[None].expand(2, 6) + 11  # spans a row end: forced positions included
        p = EAGER.pipeline(logits, positions, layout, sampling)
        torch.testing.assert_close(kernels.pipeline(logits, positions, layout, sampling), p, rtol=0, atol=1e-6)
        for rule in ("verify", "block_verify"):
            eager, compiled = getattr(EAGER, rule), getattr(kernels, rule)
            a, b = eager(p, drafts, q, n_drafts, u_accept, u_final), compiled(p, drafts, q, n_drafts, u_accept, u_final)
            assert torch.equal(a.n_accepted, b.n_accepted) and torch.equal(a.next_token, b.next_token)
            assert torch.equal(a.accepted, b.accepted)
        u = torch.rand(2, 6, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(kernels.sample_from(p, u), EAGER.sample_from(p, u))


@pytest.mark.slow
def test_a_kernel_that_reads_the_host_does_not_compile():
    """fullgraph: a graph break (here a host read, a sync on a GPU) is an error, never a silent split into graphs
    that would launch more than the one replay the counter prices."""

    def reads_the_host(x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # a branch on a device value: the host must read it
            return x * 2
        return x

    with pytest.raises(Exception, match="(?i)data-dependent|graph break|unsupported"):
        compiled_kernels(None)(reads_the_host)(torch.ones(3))


def test_the_counter_prices_a_kernel_call_as_one_replay_and_its_input_copies():
    counter = SyncCounter([])
    on_device = torch.ones(4, 3)
    counter.mark(on_device)
    host = torch.ones(4)
    with counter:
        out = counter.replay(lambda a, b: (a * 2).softmax(-1) + b[:, None])(on_device, host)
    # one replay, one copy of the device input; the host tensor is a constant of the graph, and the ops inside are
    # not launches of their own
    assert counter.counts.ops_outside_forward == 2
    assert SyncCounter.is_device(out)


@pytest.mark.parametrize("name", ["ar", "sjd", "csjd", "csjd_pac", "scd_official", "hawk"])
def test_compiled_kernels_cut_the_launches_of_an_iteration(toy, name):
    """What results/syncs.csv reports (scripts/count_syncs.py --kernels compiled): the same decode counted with its
    kernels as graph replays launches fewer operator calls an iteration, and the same host syncs."""
    adapter, sampling = toy
    adapter.use_cache("static")
    try:
        (entrant,) = entrants(decoder_configs([name]), adapter, [16], print, model_config("toy"))
        (group,) = prompt_batches("toy", 1, 1)
        prompts = [p for p, _ in group]
        counts = {}
        for graphs_of in (None, entrant.decoder):
            gens = make_generators(0, [p.prompt_id for p in prompts], adapter.device)
            decode = functools.partial(entrant.decoder.generate, adapter, prompts, sampling, gens)
            with torch.no_grad():
                counts[graphs_of is None] = count_decode(decode, adapter, {}, graphs_of)
    finally:
        adapter.use_cache("dynamic")
    eager, graphed = counts[True], counts[False]

    def per_iteration(syncs):  # the layout's tables are copied once per device, by whichever decode runs first
        return {site: n for site, n in syncs.items() if site[0] != "once"}

    assert graphed.forwards == eager.forwards and per_iteration(graphed.syncs) == per_iteration(eager.syncs)
    assert graphed.ops_outside_forward < 0.8 * eager.ops_outside_forward
    assert entrant.decoder.kernels is EAGER  # the counter's kernels were put back


@pytest.mark.slow
@pytest.mark.parametrize("own_q", [False, True])
def test_the_tree_kernel_compiles_to_the_eager_verdict(own_q):
    """SJD-PAC's verification (siblings drawn from the chain draft's q) and Hawk's (each speculation with its own q)
    as one compiled graph: the verdict, the sibling picked and the bonus are the eager ones."""
    logits, q, drafts, n_drafts, u_accept, u_final = window(3, B=4, W=6)
    g = torch.Generator().manual_seed(4)
    B, C, V = q.shape
    p = torch.softmax(torch.cat([logits.cond, logits.cond[:, :3]], 1), -1)  # chain slots 0..5, siblings 6..8
    chain_slot = torch.arange(C + 1).expand(B, C + 1)
    siblings = torch.randint(0, V, (B, 3, 1), generator=g)
    sibling_slot = (C + 1 + torch.arange(3)).view(1, 3, 1).expand(B, 3, 1).contiguous()
    sibling_q = torch.softmax(torch.randn(B, 3, 1, V, generator=g), -1) if own_q else None
    args = (p, chain_slot, drafts, q, n_drafts, torch.ones(B, 3, 1, dtype=torch.bool), siblings, sibling_slot,
            sibling_q, u_accept, torch.rand(B, 1, generator=g), u_final, torch.rand(B, generator=g),
            torch.rand(B, generator=g), 2, 3)  # fmt: skip
    eager, compiled = tree_tests(*args), compiled_kernels(None)(tree_tests)(*args)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
