"""Block verification (sjd.core.verify.block_verify): exact for drafts whose q depends on the drafts
before them, more accepted drafts than the token rule, and audited inside SJD on the micro model."""

import pytest
import torch
from scipy.stats import chisquare

from sjd.audit.stats import draw_samples
from sjd.core.sampling import SamplingConfig, sample_from
from sjd.core.seeding import make_generators
from sjd.core.verify import block_verify, verify
from sjd.decoders.ar import ARDecoder
from sjd.decoders.coupled import CoupledSJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.prompts import load_prompt_file
from sjd.models.micro import MicroAdapter

V, D, N = 4, 3, 200_000  # vocabulary, drafts per block, blocks verified at once


def _tables(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Target p(x_k | x_<k) for k = 0..D and draft q(x_k | x_<k) for k = 0..D-1, as [V]*k + [V] tables:
    both depend on the whole prefix, so the test covers drafts drawn autoregressively."""
    g = torch.Generator().manual_seed(seed)

    def table(k: int) -> torch.Tensor:
        return torch.softmax(2.0 * torch.randn((V,) * k + (V,), generator=g), -1)

    return [table(k) for k in range(D + 1)], [table(k) for k in range(D)]


def _normalised(x: torch.Tensor) -> torch.Tensor:
    return x / x.sum(-1, keepdim=True)


def _at(table: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    """[n, V]: the table's distribution after each row's prefix [n, k]."""
    return table[tuple(prefix.T)] if prefix.shape[1] else table.expand(len(prefix), V)


def _blocks(P: list[torch.Tensor], Q: list[torch.Tensor], g: torch.Generator):
    """N draft blocks drawn from Q autoregressively, with p [N, D+1, V] and q [N, D, V] at their prefixes."""
    drafts = torch.zeros(N, 0, dtype=torch.long)
    q = []
    for k in range(D):
        q_k = _at(Q[k], drafts)
        q.append(q_k)
        drafts = torch.cat([drafts, sample_from(q_k, torch.rand(N, generator=g))[:, None]], 1)
    p = torch.stack([_at(P[k], drafts[:, :k]) for k in range(D + 1)], 1)
    return drafts, p, torch.stack(q, 1)


def _completed(P: list[torch.Tensor], drafts, result, g: torch.Generator) -> torch.Tensor:
    """The committed prefix plus the next token, continued by AR sampling of P to D+1 tokens: [N]
    sequence codes. Exactness means these are distributed as P's own joint."""
    n = result.n_accepted
    seq = torch.cat([drafts, torch.zeros(N, 1, dtype=torch.long)], 1)
    seq[torch.arange(N), n] = result.next_token
    for k in range(1, D + 1):
        draw = sample_from(_at(P[k], seq[:, :k]), torch.rand(N, generator=g))
        seq[:, k] = torch.where(n < k, draw, seq[:, k])
    return (seq * V ** torch.arange(D, -1, -1)).sum(1)


def _joint(P: list[torch.Tensor]) -> torch.Tensor:
    joint = P[0]
    for k in range(1, D + 1):
        joint = joint[..., None] * P[k]
    return joint.flatten()


def _chi2_p_value(codes: torch.Tensor, joint: torch.Tensor) -> float:
    counts = torch.bincount(codes, minlength=V ** (D + 1)).double()
    expected = joint.double() / joint.double().sum() * N  # float32 tables sum to 1 only to ~1e-7
    rare = expected < 5  # pooled into one bin, as the audit does, so the chi-square approximation holds
    counts = torch.cat([counts[~rare], counts[rare].sum(0, keepdim=True)])
    expected = torch.cat([expected[~rare], expected[rare].sum(0, keepdim=True)])
    return float(chisquare(counts.numpy(), expected.numpy()).pvalue)


def _verify_blocks(rule, seed: int, claimed_q=None):
    P, Q = _tables(seed)
    g = torch.Generator().manual_seed(seed + 1)
    drafts, p, q = _blocks(P, Q, g)
    n_drafts = torch.full((N,), D)
    uniforms = torch.rand(N, D, generator=g), torch.rand(N, generator=g)
    result = rule(p, drafts, q if claimed_q is None else claimed_q, n_drafts, *uniforms)
    return P, drafts, result, g


@pytest.mark.parametrize("seed", [0, 1])
def test_block_verification_is_exact_for_autoregressive_drafts(seed):
    P, drafts, result, g = _verify_blocks(block_verify, seed)
    assert _chi2_p_value(_completed(P, drafts, result, g), _joint(P)) > 1e-3


def test_the_check_sees_a_block_verified_with_the_wrong_q():
    """Negative control: the same drafts verified as if drawn uniformly are biased, and the
    chi-square test above has the power to see it."""
    P, drafts, result, g = _verify_blocks(block_verify, 0, claimed_q=torch.full((N, D, V), 1 / V))
    assert _chi2_p_value(_completed(P, drafts, result, g), _joint(P)) < 1e-6


def test_block_verification_accepts_more_drafts_than_the_token_rule_on_the_same_blocks():
    _, _, block, _ = _verify_blocks(block_verify, 0)
    _, _, token, _ = _verify_blocks(verify, 0)  # same seed: the same blocks and uniforms
    gain = block.n_accepted.float().mean() - token.n_accepted.float().mean()
    assert gain > 0.02, gain  # 0.14 on these blocks; the token rule accepts 0.26 a block here


def test_block_verification_accepts_every_draft_when_q_is_p_and_stops_at_each_rows_own_drafts():
    g = torch.Generator().manual_seed(0)
    p = _normalised(torch.rand(2, 4, V, generator=g))
    drafts = torch.tensor([[0, 1, 2], [3, 0, 0]])
    res = block_verify(p, drafts, p[:, :3], torch.tensor([3, 1]), torch.rand(2, 3, generator=g), torch.rand(2))
    assert res.n_accepted.tolist() == [3, 1]
    assert res.accepted.tolist() == [[True, True, True], [True, False, False]]


PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:4]


@pytest.mark.slow
def test_greedy_sjd_with_block_verification_equals_greedy_ar(toy):
    greedy = SamplingConfig(cfg_scale=3.0, temperature=0.0)
    ids = [p.prompt_id for p in PROMPTS]
    ar = ARDecoder().generate(toy, PROMPTS, greedy, make_generators(0, ids, torch.device("cpu")))
    out = SJDDecoder(init="vertical_dist", verification="block").generate(
        toy, PROMPTS, greedy, make_generators(5, ids, torch.device("cpu"))
    )
    assert torch.equal(ar.tokens, out.tokens)


@pytest.mark.slow
@pytest.mark.parametrize("init", ["random", "vertical_dist"])
def test_block_verified_audit_samples_are_the_same_at_batch_1_and_batch_25(init):
    adapter, sampling = MicroAdapter(), SamplingConfig(cfg_scale=2.0)
    decoder = SJDDecoder(window=4, init=init, verification="block")
    one = draw_samples(decoder, adapter, sampling, "a", 50, 1, 0, "d")
    many = draw_samples(decoder, adapter, sampling, "a", 50, 25, 0, "d")
    assert torch.equal(one, many)


@pytest.mark.slow
@pytest.mark.parametrize("init", ["random", "vertical_dist"])
def test_sjd_with_block_verification_passes_the_exact_audit(run_audit, init):
    report = run_audit(["decoder=sjd", "decoder.verification=block", f"decoder.init={init}", "n_samples=20000"])
    assert report["lossless_expected"]
    assert report["p_value"] > 1e-3, report
    assert report["tv_distance"] < 2 * report["ar_tv_distance"] + 0.01, report


def test_an_unknown_verification_rule_is_refused_by_name():
    with pytest.raises(ValueError, match="decoder.verification"):
        SJDDecoder(verification="blocks")


@pytest.mark.slow
def test_the_audit_catches_block_verification_stacked_on_maximal_coupling(run_audit, monkeypatch):
    """Why coupled decoders keep the token rule: block verification's accepted length depends on
    every draft of the window, so the drafts that maximal coupling keeps for the next iteration
    are conditioned on it, and the micro audit rejects the result outright."""

    def block_accept(self, step, accept_uniforms, sample_uniforms):
        return block_verify(step.p, step.drafts, step.q, step.n_drafts, accept_uniforms, sample_uniforms)

    monkeypatch.setattr(CoupledSJDDecoder, "accept", block_accept)
    report = run_audit(["decoder=csjd", "n_samples=2000"])  # p ~ 1e-29 at 2,000
    assert report["p_value"] < 1e-6, report
