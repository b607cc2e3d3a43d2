"""LANTERN and LANTERN++ (sjd/decoders/lantern.py, sjd/core/relaxed_rules.py): the relaxed node test as the
released code computes it, its rejection and our grammar-bound fallback, the neighbour table, and on the micro
and toy models: no neighbour budget is EAGLE token for token, a budget accepts more, and the audit sees the loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sjd.audit.stats import draw_samples, enumerate_images, exact_test, outcome_index, sequence_probabilities
from sjd.core.relaxed_rules import (
    code_neighbours,
    grammar_fallback,
    lantern_credit,
    lantern_tree_rule,
    neighbour_table,
)
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.core.verify import recursive_rejection, without_replacement_q
from sjd.decoders.eagle import EagleDecoder
from sjd.decoders.lantern import LanternDecoder, LanternPPDecoder
from sjd.harness.runner import build_decoders
from sjd.models.micro import MicroAdapter
from sjd.types import CODE_EMBEDDINGS, Prompt

pytestmark = pytest.mark.usefixtures("one_thread")
RANDOM = {"weights": "random", "head": "full"}  # the published drafters run the full LM head
V = 12
FREE = torch.tensor([False, False] + [True] * 8 + [False, False])  # ids 2 .. 9 are codes


def line_neighbours(free: torch.Tensor = FREE, width: int = 7):
    """Codes on a line: code i sits at i, so its neighbours alternate around it (ties: the lower id first)."""
    return code_neighbours(torch.arange(len(free), dtype=torch.float32)[:, None], free, width)


def random_targets(g: torch.Generator, B: int, positive: bool = True) -> torch.Tensor:
    logits = 2 * torch.randn(B, V, generator=g)
    if not positive:  # a top-k cut: the 3 least likely codes get no mass
        cut = logits.masked_fill(~FREE, float("inf")).topk(3, dim=1, largest=False).indices
        logits = logits.scatter(1, cut, float("-inf"))
    return logits.masked_fill(~FREE, float("-inf")).softmax(1)


# -- the neighbour table ------------------------------------------------------------------------------
def test_the_table_holds_the_nearest_other_codes_in_order_compactly_and_in_chunks():
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(V, 3, generator=g)
    table = code_neighbours(emb, FREE, width=100, chunk=3)  # a width past the codebook means all of it
    assert table.table.dtype == torch.int16 and table.width == int(FREE.sum()) - 1
    x = FREE.nonzero().flatten()
    nb, there = table.of(x, table.width)
    assert there.all() and torch.equal(nb, neighbour_table(emb, FREE, table.width)[x])  # the SJD rule's table
    for row, code in zip(nb.tolist(), x.tolist()):
        dist = (emb[row] - emb[code]).norm(dim=1)
        assert code not in row and set(row) <= set(x.tolist()) and (dist[1:] >= dist[:-1]).all()
    assert torch.equal(code_neighbours(emb, FREE, 100, chunk=1024).table, table.table)
    nb, there = table.of(torch.tensor([0, 11]), 4)  # ids that are not codes have no neighbours
    assert not there.any()


def test_the_table_is_built_once_per_model_with_k_plus_1_columns():
    micro = MicroAdapter(height=2, width=2, n_codes=3)
    dec = LanternDecoder(drafter=RANDOM, neighbours=1)
    assert dec.neighbours_of(micro) is dec.neighbours_of(micro) and dec.neighbours_of(micro).width == 2
    assert CODE_EMBEDDINGS in dec.requires and not dec.lossless and not LanternPPDecoder(drafter=RANDOM).lossless


# -- the relaxed mass --------------------------------------------------------------------------------
def test_the_credit_is_the_longest_prefix_of_neighbour_mass_within_the_bound():
    target = torch.tensor([[0.3, 0.05, 0.1, 0.4, 0.15]])
    x, nb, there = torch.tensor([0]), torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.bool)
    cases = [({"delta": 0.01}, 0.3, False), ({"delta": 0.1}, 0.35, True), ({"delta": 0.2}, 0.45, True),
             ({"delta": 1.0}, 0.85, True), ({"lam": 1.0}, 0.3, False), ({"lam": 1.2}, 0.35, True),
             ({"lam": 1.6}, 0.45, True)]  # fmt: skip
    for bound, relaxed, has_j in cases:
        got, j = lantern_credit(target[0, x], target[0, nb], there, **bound)
        assert got.item() == pytest.approx(relaxed) and j.item() == has_j, bound


def test_delta_0_and_lam_1_credit_nothing_where_every_neighbour_has_mass():
    g = torch.Generator().manual_seed(1)
    target = random_targets(g, 500)
    x = torch.randint(2, 10, (500,), generator=g)
    nb, there = line_neighbours().of(x, 5)
    p_x = target[torch.arange(500), x]
    for bound in ({"delta": 0.0}, {"lam": 1.0}):
        relaxed, has_j = lantern_credit(p_x, target.gather(1, nb), there, **bound)
        assert torch.equal(relaxed, p_x) and not has_j.any()


# -- the node test ----------------------------------------------------------------------------------
def node_inputs(seed: int, B: int, K: int, children: str, positive: bool = False):
    g = torch.Generator().manual_seed(seed)
    target = random_targets(g, B, positive)
    if children == "top_k":  # distinct codes, tested with q = 1
        cands = torch.stack([torch.randperm(8, generator=g)[:K] + 2 for _ in range(B)])
        q = torch.nn.functional.one_hot(cands, V).float()
    else:  # an ordered draw without replacement from a drafter's q
        q0 = random_targets(g, B)
        cands = torch.multinomial(q0, K, generator=g)
        q = without_replacement_q(q0, cands)
    present = torch.rand(B, K, generator=g) < 0.9
    return target, cands, q, present, torch.rand(B, K, generator=g)


@pytest.mark.parametrize("children", ["top_k", "sampled"])
@pytest.mark.parametrize("zero_in", ["p", "q"])
@pytest.mark.parametrize("bound", [{"delta": 0.1}, {"delta": 1.0}, {"lam": 5.0}])
def test_with_no_neighbour_budget_the_node_test_is_recursive_rejection(children, zero_in, bound):
    args = node_inputs(2, 2000, 4, children)
    picked, left = lantern_tree_rule(*args, neighbours=line_neighbours(), k=0, zero_in=zero_in, **bound)
    exact_picked, exact_left = recursive_rejection(*args)
    assert torch.equal(picked, exact_picked) and torch.allclose(left, exact_left, atol=1e-6)
    assert (picked >= 0).any() and (picked < 0).any()


@pytest.mark.parametrize("bound", [{"delta": 0.0}, {"lam": 1.0}])
def test_a_bound_that_credits_nothing_is_the_exact_test_on_a_first_candidate(bound):
    """On strictly positive targets, one candidate: delta = 0 and lam = 1 change nothing."""
    args = node_inputs(3, 2000, 1, "sampled", positive=True)
    picked, left = lantern_tree_rule(*args, neighbours=line_neighbours(), k=5, **bound)
    exact_picked, exact_left = recursive_rejection(*args)
    assert torch.equal(picked, exact_picked) and torch.allclose(left, exact_left, atol=1e-6)


def test_as_released_delta_0_is_not_exact_once_a_rejected_sibling_is_the_first_neighbour():
    """The relaxed mass is read from the target left by earlier rejections, where a rejected sibling has 0
    mass: c_0 = 0 <= delta = 0, so J exists and the next rejection also zeroes its k + 1 neighbours."""
    target = torch.tensor([[0, 0, 0, 0.3, 0.3, 0.4, 0, 0, 0, 0, 0, 0]])
    cands, present = torch.tensor([[4, 5]]), torch.ones(1, 2, dtype=torch.bool)
    q = torch.nn.functional.one_hot(cands, V).float()
    u = torch.tensor([[0.99, 0.99]])  # both rejected
    _, left = lantern_tree_rule(target, cands, q, present, u, neighbours=line_neighbours(), k=2, delta=0.0)
    _, exact_left = recursive_rejection(target, cands, q, present, u)
    assert exact_left[0, 3] == 1.0  # the exact rule leaves code 3
    # 5's neighbours: 4 (rejected) and 6 have no mass, so J = 1 and 4, 6 and 3 are cut: nothing is left
    assert torch.allclose(left[0], FREE.float() / FREE.sum())


def test_the_relaxed_test_accepts_whenever_the_exact_one_does_and_more_often():
    args = node_inputs(4, 20000, 1, "sampled")
    picked, _ = lantern_tree_rule(*args, neighbours=line_neighbours(), k=3, delta=0.1)
    exact, _ = recursive_rejection(*args)
    assert ((exact >= 0) <= (picked >= 0)).all()
    assert (picked >= 0).float().mean() > (exact >= 0).float().mean() + 0.02


def reject_one(target: torch.Tensor, x: int, q: torch.Tensor | None = None, **rule) -> torch.Tensor:
    """The target left after candidate x (drawn from q, one-hot by default) is rejected (u just below 1)."""
    cands = torch.tensor([[x]])
    q = torch.nn.functional.one_hot(cands, V).float() if q is None else q[None, None]
    picked, left = lantern_tree_rule(target, cands, q, torch.ones(1, 1, dtype=torch.bool), torch.tensor([[0.999]]),
                                     neighbours=line_neighbours(), **rule)  # fmt: skip
    assert picked.item() == -1
    return left[0]


def test_a_rejection_zeroes_the_draft_and_its_first_k_plus_1_neighbours_only_when_j_exists():
    target = torch.tensor([[0, 0, 0.1, 0.1, 0.05, 0.2, 0.1, 0.2, 0.15, 0.1, 0, 0]])
    # code 5's neighbours: 4, 6, 3, 7, 2, 8, 9; with k = 2 the first 2 may be credited, the first 3 are cut
    left = reject_one(target, 5, k=2, delta=0.1)  # c = (0.05, 0.15): J = 0
    assert (left == 0).nonzero().flatten().tolist() == [0, 1, 3, 4, 5, 6, 10, 11]
    assert torch.allclose(left, target[0].masked_fill(left == 0, 0) / target[0, [2, 7, 8, 9]].sum())
    left = reject_one(target, 5, k=2, delta=0.01)  # no J: only the draft goes
    assert torch.allclose(left, target[0].index_fill(0, torch.tensor([5]), 0) / 0.8)
    left = reject_one(target, 5, k=2, lam=1.3)  # (lam - 1) p(5) = 0.06: J = 0, multiplicative bound
    assert (left[[3, 4, 5, 6]] == 0).all() and (left[[2, 7, 8, 9]] > 0).all()
    # EAGLE-1's rule for LlamaGen and Anole: the neighbours are zeroed in q, then p <- norm(max(p - q, 0))
    q = torch.tensor([0, 0, 0.05, 0.1, 0.1, 0.5, 0.1, 0.05, 0.05, 0.05, 0, 0])  # p~(5) / q(5) = 0.25 / 0.5
    left = reject_one(target, 5, q, k=2, delta=0.1, zero_in="q")
    cut = q.index_fill(0, torch.tensor([4, 6, 3]), 0)
    expected = (target[0] - cut).clamp_min(0)
    assert torch.allclose(left, expected / expected.sum())
    left = reject_one(target, 5, q, k=2, delta=0.1, zero_in="p")  # Lumina-mGPT's: zeroed in p
    expected = (target[0].index_fill(0, torch.tensor([4, 6, 3]), 0) - q).clamp_min(0)
    assert torch.allclose(left, expected / expected.sum())


def test_an_emptied_residual_falls_back_to_the_ids_the_grammar_allows():
    """The released code falls back to uniform over the whole vocabulary; we keep to the allowed ids."""
    target = torch.tensor([[0, 0, 0, 0, 0.05, 0.2, 0.75, 0, 0, 0, 0, 0]])  # on code 5 and its 2 nearest only
    left = reject_one(target, 5, k=1, delta=0.1)  # J = 0 (0.05): 5, 4 and 6 are cut, nothing is left
    assert torch.allclose(left, FREE.float() / FREE.sum())
    g = torch.Generator().manual_seed(5)
    assert FREE[torch.multinomial(left, 10000, replacement=True, generator=g)].all()
    forced = torch.zeros(1, V).index_fill(1, torch.tensor([11]), 1.0)  # a forced position: one non-code id
    assert torch.equal(grammar_fallback(forced, FREE), forced)


# -- the decoders on the micro and toy models --------------------------------------------------------
def micro_and_sampling():
    micro = MicroAdapter(height=2, width=2, n_codes=3, seed=0, logit_scale=6.0)
    return micro, SamplingConfig(cfg_scale=2.0, temperature=1.0)


def decode(decoder, adapter, sampling, prompts):
    return decoder.generate(adapter, prompts, sampling, make_generators(0, [p.prompt_id for p in prompts], "cpu"))


class EagleByRecursiveRejection(EagleDecoder):
    """`eagle` with its rule in recursive-rejection form (one-hot q a child): the coins LANTERN's rule draws.
    `eagle` itself draws once a node (sample_and_descend), the same distribution with other coins."""

    def node_rule(self, adapter):
        return recursive_rejection


def test_with_no_neighbour_budget_lantern_is_eagle_and_lantern_pp_is_eagle_sampled():
    micro, sampling = micro_and_sampling()
    prompts = [Prompt(f"m{i}", "ab"[i % 2]) for i in range(60)]
    pairs = [
        (LanternDecoder(drafter=RANDOM, neighbours=0),
         EagleByRecursiveRejection(drafter=RANDOM, depth=4, total_tokens=59)),
        (LanternPPDecoder(drafter=RANDOM, neighbours=0),
         EagleDecoder(drafter=RANDOM, tree="naive_extend_57", total_tokens=58, children="sampled")),
    ]  # fmt: skip
    for relaxed, exact in pairs:
        a, b = decode(relaxed, micro, sampling, prompts), decode(exact, micro, sampling, prompts)
        assert torch.equal(a.tokens, b.tokens) and a.n_forward == b.n_forward


def test_lantern_takes_fewer_forwards_than_eagle_on_the_toy(toy):
    sampling = SamplingConfig(cfg_scale=3.0, temperature=1.0)
    prompts = [Prompt("t0", "large red circle center"), Prompt("t1", "small blue square top left on green")]
    relaxed = decode(LanternDecoder(drafter=RANDOM), toy, sampling, prompts)
    exact = decode(EagleDecoder(drafter=RANDOM, depth=4, total_tokens=59), toy, sampling, prompts)
    assert sum(relaxed.n_forward) < 0.8 * sum(exact.n_forward)
    forced = toy.layout.forced
    assert (relaxed.tokens[:, forced >= 0] == forced[forced >= 0]).all()
    assert toy.layout.free_tokens[relaxed.tokens[:, forced < 0]].all()


def test_the_micro_audit_sees_the_relaxation_and_not_its_absence():
    micro, sampling = micro_and_sampling()
    images = enumerate_images(micro)
    probs = sequence_probabilities(micro, Prompt("a", "a"), images, sampling).numpy()

    def p_value(decoder) -> float:
        samples = draw_samples(decoder, micro, sampling, "a", 600, 600, 0, "d")
        counts = np.bincount(outcome_index(samples, images), minlength=len(images))  # every sample is a layout
        return exact_test(counts, probs).p_value

    assert p_value(LanternDecoder(drafter=RANDOM, delta=0.5)) < 1e-6
    assert p_value(LanternPPDecoder(drafter=RANDOM, lam=50.0)) < 1e-6
    assert p_value(LanternDecoder(drafter=RANDOM, neighbours=0)) > 1e-3  # EAGLE-2's exact rule


# -- settings ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cls", "kwargs", "names"),
    [
        (LanternDecoder, {"delta": 5.0}, ["decoder.delta", "decoder.lam"]),
        (LanternDecoder, {"neighbours": -1}, ["decoder.neighbours"]),
        (LanternDecoder, {"zero_neighbours_in": "r"}, ["decoder.zero_neighbours_in"]),
        (LanternPPDecoder, {"lam": 0.5}, ["decoder.lam"]),
    ],
)
def test_bad_settings_name_their_key(cls, kwargs, names):
    with pytest.raises(ValueError) as err:
        cls(drafter=RANDOM, **kwargs)
    assert all(n in str(err.value) for n in names)


def test_the_paper_overlay_pins_lanterns_llamagen_setting(compose_cfg):
    cfg = compose_cfg(["experiment=lantern_llamagen_coco", "decoder.drafter.weights=random"])
    decoders = {d.name: d for d in build_decoders(cfg)[0]}
    lantern, eagle = decoders["lantern"], decoders["eagle"]
    assert (lantern.tree, lantern.total_tokens, lantern.depth, lantern.top_k) == ("dynamic", 59, 4, 10)
    assert (lantern.neighbours, lantern.delta, lantern.drafter) == (1000, 0.1, RANDOM)
    assert type(eagle) is EagleDecoder and eagle.lossless and eagle.drafter == RANDOM
    assert {k: getattr(eagle, k) for k in ("tree", "total_tokens", "depth", "top_k", "children")} == {
        k: getattr(lantern, k) for k in ("tree", "total_tokens", "depth", "top_k", "children")
    }
    assert cfg.model.name == "llamagen" and cfg.model.adapter.resolution == 256 and cfg.prompts.name == "coco5k"
    assert dict(cfg.model.sampling) == {"cfg_scale": 3.0, "temperature": 1.0, "top_k": 2000, "top_p": 1.0}
    assert cfg.baseline.name == "ar"
