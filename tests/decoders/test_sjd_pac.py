"""Branch drafting (SJD-PAC's proactive drafting on coupled SJD): the sibling draw, the
recursive rejection step, greedy equality with AR, batch independence and the exact audit."""

from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from sjd.audit.stats import draw_samples
from sjd.core.sampling import SamplingConfig, sample_from
from sjd.core.seeding import make_generators
from sjd.core.verify import accept_tests, residual
from sjd.decoders.ar import ARDecoder
from sjd.decoders.sjd_pac import ONE_HOT, SJDPACDecoder, draw_siblings, room_stats, verify_siblings
from sjd.harness.prompts import load_prompt_file
from sjd.models.micro import MicroAdapter
from sjd.types import Prompt

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = load_prompt_file(ROOT / "sjd/assets/prompts/toy.tsv")[:3]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0)


def gens(prompts, seed=0):
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


def test_siblings_are_drawn_without_replacement_and_never_repeat_the_chain_draft():
    g = torch.Generator().manual_seed(0)
    q = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 1.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    chain = torch.tensor([0, 1, 3])
    ids, ok = draw_siblings(q, chain, 3, torch.rand(3, 4, generator=g))
    assert ok.tolist() == [[True, True, False], [False, False, False], [True, True, True]]
    assert set(ids[0, :2].tolist()) == {1, 2}
    assert set(ids[2].tolist()) == {0, 1, 2}
    # The first sibling is distributed as q without the chain draft, renormalised.
    N = 100_000
    first, _ = draw_siblings(q[:1].expand(N, 4), chain[:1].expand(N), 1, torch.rand(N, 4, generator=g))
    counts = torch.bincount(first[:, 0], minlength=4).numpy()
    assert counts[0] == counts[3] == 0
    assert chisquare(counts[1:3], [0.6 * N, 0.4 * N]).pvalue > 1e-3


def test_the_host_plan_counts_the_siblings_that_the_draw_gives():
    """The window is laid out from each carried draft's sibling room (`room_stats`, read to the host with the commit
    before it): for each carried draft the draw's existing siblings must be exactly its first min(K - 1, room) (q's
    ids with mass, the chain draft's excepted), and a q whose top mass reaches ONE_HOT has no room. Tiny masses, a
    chain draft outside q and a top mass just below ONE_HOT in float32 included."""
    g = torch.Generator().manual_seed(3)
    V, K1 = 12, 3
    q = torch.rand(40, V, generator=g) * (torch.rand(40, V, generator=g) < 0.3)
    q[:4] = 0.0
    q[0, 5] = 1.0  # one-hot
    q[1, [2, 7]] = torch.tensor([1.0, 1e-38])  # a tiny (subnormal) mass is still an id with mass
    q[2, 3] = 1.0  # the chain draft below has no mass here
    q[3, [1, 2]] = 0.5
    q = q / q.sum(-1, keepdim=True).clamp_min(1e-30)
    q[4:6] = 0.0  # no mass at all
    q[6] = 0.0
    q[6, [0, 1]] = torch.tensor([1 - 17 * 2**-24, 17 * 2**-24])  # top mass below ONE_HOT, but not in float32
    chain = torch.where(q.sum(-1) > 0, sample_from(q.clamp_min(0), torch.rand(40, generator=g)), 0)
    chain[2] = 4
    room = room_stats(q, chain).tolist()
    _, ok = draw_siblings(q, chain, K1, torch.rand(40, V, generator=g))
    counts = torch.tensor([min(K1, r) for _, r in room])
    assert torch.equal(ok, torch.arange(K1)[None, :] < counts[:, None])
    assert [bool(has) for has, _ in room] == [top < ONE_HOT for top in q.max(-1).values.tolist()]
    assert room[0] == [0, 0] and room[1][1] == 1 and room[2][1] == 1 and room[3][1] == 1 and room[4][1] == 0
    assert room[6][0] == 1


def test_recursive_rejection_over_siblings_samples_p_and_accepts_more_often():
    """Chain draft c ~ q, siblings without replacement from q minus c, the chain test, then
    verify_siblings and the last residual: the committed token is distributed as p."""
    g = torch.Generator().manual_seed(1)
    V, N, K1 = 7, 200_000, 3
    p = torch.tensor([0.02, 0.3, 0.05, 0.2, 0.0, 0.33, 0.1])
    q = torch.tensor([0.25, 0.05, 0.3, 0.1, 0.2, 0.0, 0.1])
    P, Q = p.expand(N, V), q.expand(N, V)
    c = sample_from(Q, torch.rand(N, generator=g))
    sib, present = draw_siblings(Q, c, K1, torch.rand(N, V, generator=g))
    chain_ok = accept_tests(P[:, None], c[:, None], Q[:, None], torch.rand(N, 1, generator=g))[:, 0]
    picked, target = verify_siblings(residual(P, Q), Q, c, sib, present, torch.rand(N, K1, generator=g))
    rows = torch.arange(N)
    out = torch.where(
        chain_ok,
        c,
        torch.where(picked >= 0, sib[rows, picked.clamp(min=0)], sample_from(target, torch.rand(N, generator=g))),
    )
    counts = torch.bincount(out, minlength=V).numpy()
    assert counts[4] == 0
    support = (p > 0).numpy()
    expected = p[support].double() / p[support].double().sum() * N
    assert chisquare(counts[support], expected.numpy()).pvalue > 1e-3
    one_draft = torch.minimum(p, q).sum().item()
    with_siblings = (chain_ok | (picked >= 0)).float().mean().item()
    assert with_siblings > one_draft + 0.2  # 0.45 -> about 0.9 here


@pytest.mark.parametrize("window,branches,depth", [(16, 2, 3), (64, 4, 3)])  # (64, 4, 1): csjd_tree.yaml
def test_greedy_branching_equals_greedy_ar(toy, one_thread, window, branches, depth):
    ar = ARDecoder().generate(toy, PROMPTS[:2], GREEDY, gens(PROMPTS[:2]))
    tree = SJDPACDecoder(window=window, branches=branches, branch_depth=depth)
    assert torch.equal(tree.generate(toy, PROMPTS[:2], GREEDY, gens(PROMPTS[:2])).tokens, ar.tokens)


def test_sampled_rows_do_not_depend_on_their_batch_and_siblings_get_committed(toy, one_thread):
    decoder = SJDPACDecoder(window=32, branches=4, branch_depth=2)
    batch = decoder.generate(toy, PROMPTS, SAMPLED, gens(PROMPTS))
    assert sum(batch.extras["branch_commits"]) > 0  # the sibling path ran
    for i, prompt in enumerate(PROMPTS):
        alone = decoder.generate(toy, [prompt], SAMPLED, gens([prompt]))
        assert torch.equal(alone.tokens[0], batch.tokens[i])
        assert alone.n_forward[0] == batch.n_forward[i]
        assert sum(batch.accepted[i]) == toy.layout.n_tokens
    layout = toy.layout
    forced = layout.forced >= 0
    assert torch.equal(batch.tokens[:, forced], layout.forced[forced].expand(len(PROMPTS), -1))


def test_siblings_are_committed_on_the_micro_model_at_the_audits_settings(one_thread):
    """Otherwise the audit below would not exercise the sibling path."""
    adapter = MicroAdapter()
    decoder = SJDPACDecoder(window=8, branches=3, branch_depth=2)
    sampling = SamplingConfig(cfg_scale=2.0)
    prompts = [type(PROMPTS[0])(f"d{i}", "a") for i in range(300)]
    result = decoder.generate(adapter, prompts, sampling, gens(prompts))
    assert sum(result.extras["branch_commits"]) > 0.02 * sum(result.n_forward)


@pytest.mark.parametrize(
    "overrides",
    [
        ["decoder=csjd_tree", "decoder.branches=3", "decoder.branch_depth=2", "micro_decoder.window=8"],
        ["decoder=sjd_pac", "decoder.branches=3", "decoder.branch_depth=2", "micro_decoder.window=8"],
        [
            "decoder=csjd_tree",
            "decoder.coupling=gumbel",
            "decoder.branches=3",
            "decoder.branch_depth=2",
            "micro_decoder.window=8",
        ],
        # Window 4: the whole image no longer fits the first window, so vertical_dist draws (about one
        # an image) meet siblings (committed in about 5% of images).
        ["decoder=csjd_tree", "decoder.branches=2", "decoder.branch_depth=1"],
        ["decoder=csjd_pac", "micro_decoder.window=8"],  # as shipped: SJD-PAC's tree over vertical_dist drafts
    ],
    ids=["csjd-tree", "sjd-pac", "csjd-tree-gumbel", "csjd-tree-w4-vertical-dist", "csjd-pac"],
)
@pytest.mark.slow
def test_branching_decoders_pass_the_exact_audit(run_audit, overrides):
    report = run_audit([*overrides, "n_samples=20000"])
    assert report["lossless_expected"]
    assert report["p_value"] > 1e-3, report
    assert report["tv_distance"] < 2 * report["ar_tv_distance"] + 0.01, report


def test_batch_one_and_batch_many_draw_the_same_audit_samples(one_thread):
    adapter = MicroAdapter()
    decoder = SJDPACDecoder(window=8, branches=3, branch_depth=2)
    sampling = SamplingConfig(cfg_scale=2.0)
    one = draw_samples(decoder, adapter, sampling, "a", 40, 1, 0, "d")
    many = draw_samples(decoder, adapter, sampling, "a", 40, 20, 0, "d")
    assert torch.equal(one, many)


def test_bad_branch_settings_name_the_key():
    with pytest.raises(ValueError, match="decoder.branches"):
        SJDPACDecoder(branches=0)


def test_the_window_4_audit_reaches_vertical_dist_draws_and_committed_siblings(monkeypatch, one_thread):
    """What the csjd-tree-w4-vertical-dist audit is there for: on the micro model at window 4 it
    makes about one distribution draft an image and commits a sibling in a few images in a hundred."""
    import sjd.decoders.sjd as sjd_module

    original, draws = sjd_module.top_up_rows, []

    def counting(scheme, force, state, needs, layout, generators):
        carried = [min(len(c), need) for c, need in zip(state.carried, needs)]
        out = original(scheme, force, state, needs, layout, generators)
        # each row's fresh drafts: a distribution draw has a q that is not one-hot
        draws.extend(int((q[k:].max(-1).values < 1.0).sum()) for (_, q), k in zip(out, carried) if len(q) > k)
        return out

    monkeypatch.setattr(sjd_module, "top_up_rows", counting)
    n = 300
    prompts = [Prompt(str(i), "a") for i in range(n)]
    decoder = SJDPACDecoder(window=4, branches=2, branch_depth=1)
    result = decoder.generate(MicroAdapter(), prompts, SamplingConfig(cfg_scale=2.0), gens(prompts))
    assert 0.5 < sum(draws) / n < 2
    assert 0.02 < sum(c > 0 for c in result.extras["branch_commits"]) / n < 0.2
