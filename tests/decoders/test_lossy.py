"""The lossy comparators: GSD and LANTERN-style relaxed acceptance, ZipAR next-set decoding."""

from pathlib import Path

import pytest
import torch

from sjd.core.relaxed_rules import gsd_masses, lantern_masses, lantern_rejection, neighbour_table
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.relaxed import RelaxedSJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.zipar import ZipARDecoder
from sjd.harness.prompts import load_prompt_file
from sjd.models.micro import MicroAdapter
from sjd.sjd2.micro import MicroSJD2Adapter

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:4]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0)


def gens(prompts, seed=0):
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


def test_neighbours_are_the_nearest_codes_in_latent_space():
    micro = MicroAdapter()  # codes 5, 6, 7 at grey levels 0, 0.5, 1
    table = neighbour_table(micro.code_embeddings(), micro.layout.free_tokens, 2)
    assert table[5].tolist() == [6, 7] and table[7].tolist() == [6, 5] and table[6, 0].item() in (5, 7)


def test_gsd_groups_only_close_probabilities_and_lantern_credits_within_its_budget():
    table = torch.tensor([[1, 2], [0, 2], [1, 0]])  # V = 3
    p = torch.tensor([[[0.5, 0.4, 0.1, 0.0]]])[..., :3]  # [1, 1, 3]
    q = torch.tensor([[[0.2, 0.3, 0.5]]])
    drafts = torch.tensor([[0]])
    p_g, q_g, member = gsd_masses(p, q, drafts, table, p_tol=0.15, rank_radius=7)
    assert member.tolist() == [[[True, False]]]  # |0.4 - 0.5| < 0.15, |0.1 - 0.5| is not
    assert torch.allclose(p_g, torch.tensor([[0.9]])) and torch.allclose(q_g, torch.tensor([[0.5]]))
    p_l, q_l, credited = lantern_masses(p, q, drafts, table, delta=0.45)
    assert credited.tolist() == [[[True, False]]]  # 0.4 fits the budget, 0.4 + 0.1 does not
    assert torch.allclose(p_l, torch.tensor([[0.9]])) and torch.allclose(q_l, torch.tensor([[0.2]]))
    rejection = lantern_rejection(torch.cat([p, p], 1), drafts, table, credited)
    assert torch.allclose(rejection, torch.tensor([[[0.0, 0.0, 1.0]]]))


def test_gsd_with_zero_tolerance_is_sjd_token_for_token(toy):
    """With p_tol = 0 every group is the draft alone: the same test, residual and random
    stream as SJD, so the same tokens; the relaxation is the only difference."""
    sjd = SJDDecoder(window=8).generate(toy, PROMPTS, SAMPLED, gens(PROMPTS))
    gsd = RelaxedSJDDecoder(window=8, acceptance="gsd", p_tol=0.0)
    gsd.check(toy)
    assert torch.equal(gsd.generate(toy, PROMPTS, SAMPLED, gens(PROMPTS)).tokens, sjd.tokens)


@pytest.mark.parametrize("acceptance", ["gsd", "lantern"])
def test_relaxed_decoders_keep_the_grammar_and_accept_more(toy, acceptance):
    d = RelaxedSJDDecoder(window=16, acceptance=acceptance, neighbours=8, delta=0.5, p_tol=0.5)
    d.check(toy)
    res = d.generate(toy, PROMPTS, SAMPLED, gens(PROMPTS))
    forced = toy.layout.forced
    assert (res.tokens[:, forced >= 0] == forced[forced >= 0]).all()
    assert toy.layout.free_tokens[res.tokens[:, forced < 0]].all()
    sjd = SJDDecoder(window=16).generate(toy, PROMPTS, SAMPLED, gens(PROMPTS))
    assert sum(res.n_forward) < sum(sjd.n_forward)


def test_relaxed_decoder_names_the_missing_capability():
    with pytest.raises(ValueError, match="code_embeddings"):
        RelaxedSJDDecoder().check(MicroSJD2Adapter())


def test_zipar_with_full_row_context_is_greedy_ar_and_with_less_context_takes_fewer_forwards(toy):
    ar = ARDecoder().generate(toy, PROMPTS, GREEDY, gens(PROMPTS))
    full = ZipARDecoder(context=toy.layout.width).generate(toy, PROMPTS, GREEDY, gens(PROMPTS))
    assert torch.equal(full.tokens, ar.tokens)
    short = ZipARDecoder(context=4).generate(toy, PROMPTS, SAMPLED, gens(PROMPTS))
    assert max(short.n_forward) < min(full.n_forward) < toy.layout.n_tokens
    forced = toy.layout.forced
    assert (short.tokens[:, forced >= 0] == forced[forced >= 0]).all()


@pytest.mark.slow
def test_the_audit_measures_the_relaxation(run_audit):
    """GSD with a wide group is not exact and the audit sees it; with no tolerance it is SJD."""
    loose = run_audit(["decoder=gsd", "decoder.neighbours=2", "decoder.p_tol=1.0", "n_samples=2000"])  # p = 0 at 2,000
    exact = run_audit(["decoder=gsd", "decoder.p_tol=0.0", "n_samples=20000"])
    assert not loose["lossless_expected"]
    assert loose["p_value"] < 1e-6 and loose["tv_distance"] > 2 * loose["ar_tv_distance"], loose
    assert exact["p_value"] > 1e-3, exact
