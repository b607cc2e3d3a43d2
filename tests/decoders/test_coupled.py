"""Coupled SJD (SCD's Gumbel and maximal coupling, our combination): the couplings' marginals,
greedy equality with AR, batch independence, and the exactness audit (with the trap it catches)."""

from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from sjd.audit.stats import draw_samples
from sjd.core.drafts import distribution_drafts
from sjd.core.sampling import SamplingConfig, sample_from
from sjd.core.seeding import make_generators
from sjd.core.verify import accept_tests
from sjd.decoders.ar import ARDecoder
from sjd.decoders.coupled import CoupledSJDDecoder, gumbel_drafts, maximal_coupling_drafts
from sjd.harness.prompts import load_prompt_file
from sjd.models.micro import MicroAdapter
from sjd.types import Prompt

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:4]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0)
# Settings beyond conf/decoder/scd.yaml (random, gumbel) and csjd.yaml (vertical_dist, maximal), which the
# decoder contract (tests/decoders/test_decoder_contract.py) runs.
COUPLED = [
    CoupledSJDDecoder(window=16, init="random", coupling="maximal"),
    CoupledSJDDecoder(window=7, init="vertical", coupling="maximal"),
    CoupledSJDDecoder(window=16, init="vertical", coupling="gumbel", forced_drafts=False),
    CoupledSJDDecoder(window=16, init="vertical_dist", coupling="gumbel"),
]
COUPLED_IDS = ["maximal", "maximal-vertical-w7", "gumbel-unforced", "vertical-dist-gumbel"]


def gens(prompts, seed=0):
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


def test_maximal_coupling_turns_q_draws_into_p_draws_and_keeps_the_overlap():
    """The continuation step: a draft d ~ q goes out distributed as p, and stays put with
    probability sum(min(p, q)) (the maximal coupling)."""
    g = torch.Generator().manual_seed(0)
    V, N = 6, 200_000
    p = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.0, 0.2])
    q = torch.tensor([0.3, 0.1, 0.1, 0.2, 0.3, 0.0])
    drafts = sample_from(q.expand(N, V), torch.rand(N, generator=g))[:, None]
    P, Q = p.expand(N, 2, V), q.expand(N, 1, V)
    accepted = accept_tests(P, drafts, Q, torch.rand(N, 1, generator=g))
    fresh = sample_from(P, torch.rand(N, 2, generator=g))
    out = maximal_coupling_drafts(P, drafts, Q, torch.ones(N, dtype=torch.long), accepted, torch.rand(N, 2), fresh)
    counts = torch.bincount(out[:, 0], minlength=V).numpy()
    assert counts[4] == 0  # p has no mass there
    support = p > 0
    assert chisquare(counts[support.numpy()], (p[support].double() * N).numpy()).pvalue > 1e-3
    stay = (out[:, 0] == drafts[:, 0]).float().mean().item()
    assert abs(stay - torch.minimum(p, q).sum().item()) < 0.01
    assert torch.equal(out[:, 1], fresh[:, 1])  # the bonus slot has nothing to couple with


def test_gumbel_drafts_sample_p_and_stay_put_when_p_barely_moves():
    g = torch.Generator().manual_seed(1)
    V, N = 8, 100_000
    p = torch.softmax(torch.randn(V, generator=g), 0)
    p_moved = torch.softmax(p.log() + 0.05 * torch.randn(V, generator=g), 0)
    noise = -torch.log(-torch.log(torch.rand(N, 2, V, generator=g)))
    positions = torch.zeros(N, 1, dtype=torch.long)
    a = gumbel_drafts(p.expand(N, 1, V), noise, positions)[:, 0]
    b = gumbel_drafts(p_moved.expand(N, 1, V), noise, positions)[:, 0]
    assert (
        chisquare(torch.bincount(a, minlength=V).double().numpy(), (p.double() / p.double().sum() * N).numpy()).pvalue
        > 1e-3
    )
    independent = (p * p_moved).sum().item()
    assert (a == b).float().mean().item() > 0.9 > independent  # coupled, far above independent draws


@pytest.mark.slow
@pytest.mark.parametrize("decoder", COUPLED, ids=COUPLED_IDS)
def test_greedy_coupled_decoders_equal_greedy_ar(toy, decoder):
    ar = ARDecoder().generate(toy, PROMPTS, GREEDY, gens(PROMPTS))
    out = decoder.generate(toy, PROMPTS, GREEDY, gens(PROMPTS, seed=5))
    assert torch.equal(ar.tokens, out.tokens)
    assert all(n < toy.layout.n_tokens for n in out.n_forward)


@pytest.mark.slow
@pytest.mark.parametrize("decoder", COUPLED[:2] + COUPLED[3:], ids=COUPLED_IDS[:2] + COUPLED_IDS[3:])
def test_sampled_coupled_decoders_keep_the_grammar(toy, decoder):
    res = decoder.generate(toy, PROMPTS, SAMPLED, gens(PROMPTS))
    forced = toy.layout.forced
    assert (res.tokens[:, forced >= 0] == forced[forced >= 0]).all()
    assert toy.layout.free_tokens[res.tokens[:, forced < 0]].all()
    assert [sum(a) for a in res.accepted] == [toy.layout.n_tokens] * len(PROMPTS)


@pytest.mark.slow
@pytest.mark.parametrize("init", ["vertical", "vertical_dist"])
@pytest.mark.parametrize("coupling", ["gumbel", "maximal"])
def test_audit_samples_are_the_same_at_batch_1_and_batch_25(coupling, init):
    """Each row follows its own trajectory from its own generator, so the batch > 1 audit below
    also audits batch 1 (running N = 20,000 one at a time would take half an hour)."""
    adapter, sampling = MicroAdapter(), SamplingConfig(cfg_scale=2.0)
    decoder = CoupledSJDDecoder(window=4, init=init, coupling=coupling)
    one = draw_samples(decoder, adapter, sampling, "a", 50, 1, 0, "d")
    many = draw_samples(decoder, adapter, sampling, "a", 50, 25, 0, "d")
    assert torch.equal(one, many)


@pytest.mark.parametrize(
    "overrides",
    # scd, csjd and csjd_gumbel as shipped are audited with every lossless config (tests/audit/test_audit.py)
    [["decoder=scd", "decoder.coupling=maximal"], ["decoder=csjd", "decoder.init=vertical"]],
    ids=["scd-maximal", "csjd-vertical-copy"],
)
@pytest.mark.slow
def test_coupled_decoders_pass_the_exact_audit(run_audit, overrides):
    report = run_audit([*overrides, "n_samples=20000"])
    assert report["lossless_expected"]
    assert report["p_value"] > 1e-3, report
    assert report["tv_distance"] < 2 * report["ar_tv_distance"] + 0.01, report


@pytest.mark.slow
def test_the_audit_catches_a_kept_draft_that_keeps_its_old_q(run_audit, monkeypatch):
    """A draft kept by the continuation test is distributed as the new p; storing its old q
    instead (as one released SCD-MC file does) biases the next test, and the audit sees it."""
    original = CoupledSJDDecoder.next_drafts

    def old_q_for_kept_drafts(self, step, uniforms):
        samples, samples_q = original(self, step, uniforms)
        samples_q = samples_q.clone()
        D = step.drafts.shape[1]
        samples_q[:, :D] = torch.where(step.result.accepted[..., None], step.q, samples_q[:, :D])
        return samples, samples_q

    monkeypatch.setattr(CoupledSJDDecoder, "next_drafts", old_q_for_kept_drafts)
    report = run_audit(["decoder=csjd", "decoder.init=vertical", "n_samples=8000"])  # the README's row; p ~ 1e-17
    assert report["p_value"] < 1e-6, report


def test_vertical_dist_draws_from_the_committed_p_above_and_copies_the_token_above_elsewhere(toy):
    layout, g = toy.layout, torch.Generator().manual_seed(0)
    S, V, free = layout.row_stride, layout.vocab_size, layout.free_token_ids
    start = layout.first_code + S + 2  # row 1, column 2: positions above up to row 1's start are committed
    known = torch.where(
        layout.forced[:start] >= 0, layout.forced[:start], free[torch.randint(len(free), (start,), generator=g)]
    )
    committed_p = torch.zeros(S, V)
    committed_p[:, free] = torch.softmax(torch.randn(S, len(free), generator=g), -1)
    noise = -torch.log(-torch.log(torch.rand(layout.n_tokens + 1, V, generator=g)))
    ids, q = distribution_drafts(known, start, 2 * S, layout, g, start, committed_p, noise)
    seq = torch.cat([known, ids])
    drawn = copied = 0
    for i, pos in enumerate(range(start, start + 2 * S)):
        above = pos - S
        if layout.forced[pos] >= 0:
            assert ids[i] == layout.forced[pos] and q[i, ids[i]] == 1.0
        elif above < start:  # committed above: a draw from its p with this position's Gumbel vector
            assert torch.equal(q[i], committed_p[above % S])
            assert ids[i] == (q[i].log() + noise[pos]).argmax()
            drawn += 1
        else:  # the token above is itself a draft: copied, one-hot q
            assert ids[i] == seq[above] and q[i, ids[i]] == 1.0
            copied += 1
    assert drawn == S - 1 and copied > 0  # the next row_stride positions but the end-of-line; then copies


@pytest.mark.slow
def test_the_audit_catches_vertical_dist_drafts_whose_q_is_not_what_drew_them(run_audit, monkeypatch):
    """A draft drawn uniformly but verified as if drawn from the p above is biased; the audit on the
    micro model sees it, so the exactness audit above does exercise the distribution drafts."""
    import sjd.decoders.sjd as sjd_module

    original = sjd_module.top_up_rows

    def uniform_ids_claimed_from_q(scheme, force, state, needs, layout, generators):
        carried = [min(len(c), need) for c, need in zip(state.carried, needs)]
        out = original(scheme, force, state, needs, layout, generators)
        free = layout.free_token_ids
        for b, ((ids, q), k) in enumerate(zip(out, carried)):
            if len(ids) > k:  # the row's fresh drafts: the drawn ones replaced by uniform ids, q left as drawn
                spread = q[k:].max(-1).values < 1.0
                uniform = free[torch.randint(len(free), (len(ids) - k,), generator=generators[b])]
                out[b] = (torch.cat([ids[:k], torch.where(spread, uniform, ids[k:])]), q)
        return out

    monkeypatch.setattr(sjd_module, "top_up_rows", uniform_ids_claimed_from_q)
    report = run_audit(["decoder=csjd", "n_samples=8000"])  # p ~ 1e-11 at 8,000
    assert report["p_value"] < 1e-6, report


@pytest.mark.parametrize("coupling", ["maximal", "gumbel"])
def test_the_window_4_audit_reaches_vertical_dist_draws(monkeypatch, coupling):
    """The csjd audits run at the micro model's window 4, where about one fresh draft in ten is a
    distribution draw (the rest have no committed code above them yet)."""
    import sjd.decoders.sjd as sjd_module

    original, drawn, fresh = sjd_module.top_up_rows, [], []

    def counting(scheme, force, state, needs, layout, generators):
        carried = [min(len(c), need) for c, need in zip(state.carried, needs)]
        out = original(scheme, force, state, needs, layout, generators)
        for (ids, q), k in zip(out, carried):
            if len(ids) > k:  # the row's fresh drafts: a distribution draw has a q that is not one-hot
                drawn.append(int((q[k:].max(-1).values < 1.0).sum()))
                fresh.append(len(ids) - k)
        return out

    monkeypatch.setattr(sjd_module, "top_up_rows", counting)
    prompts = [Prompt(str(i), "a") for i in range(300)]
    decoder = CoupledSJDDecoder(window=4, init="vertical_dist", coupling=coupling)
    decoder.generate(MicroAdapter(), prompts, SamplingConfig(cfg_scale=2.0), gens(prompts))
    assert 0.05 < sum(drawn) / sum(fresh) < 0.2
