"""Head siblings in the coupled chain (sjd.decoders.head_siblings), and `replace: missing` (sjd.decoders.headed): the
chain stays the coupled decoder's, the heads' drafts are committed as siblings verified with their own q, and the
micro-model audit fails the slip of verifying them with the chain draft's q."""

import dataclasses
from pathlib import Path

import pytest
import torch

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.head_siblings import CoupledHeadSiblingsDecoder
from sjd.decoders.headed import SJDPACHeadsDecoder
from sjd.harness.prompts import load_prompt_file
from sjd.models.micro import MicroAdapter
from sjd.types import Prompt

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = load_prompt_file(ROOT / "sjd/assets/prompts/toy.tsv")[:3]
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0)
GREEDY = dataclasses.replace(SAMPLED, temperature=0.0)
HEADS = {"weights": "sjd/assets/heads_toy"}  # offsets 1 to 4: right heads only
SPATIAL = {"weights": "sjd/assets/spatial_heads_toy"}  # and heads one and two rows below

pytestmark = pytest.mark.usefixtures("one_thread")


def gens(prompts=PROMPTS, seed: int = 0) -> list[torch.Generator]:
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


@pytest.mark.parametrize("heads", [HEADS, SPATIAL], ids=["right", "spatial"])
def test_greedy_head_siblings_is_greedy_ar(toy, heads):
    decoder = CoupledHeadSiblingsDecoder(heads=heads)
    decoder.check(toy)
    ar = ARDecoder().generate(toy, PROMPTS, GREEDY, gens())
    assert torch.equal(decoder.generate(toy, PROMPTS, GREEDY, gens()).tokens, ar.tokens)


@pytest.mark.parametrize("heads", [HEADS, SPATIAL], ids=["right", "spatial"])
def test_the_heads_never_replace_a_chain_draft_and_their_drafts_are_committed_as_siblings(toy, heads, monkeypatch):
    """Every heads call leaves the coupled chain's carried drafts as they were and caches its drafts, each with its
    q, at their positions; siblings are laid out with their own q, and some forwards commit one."""
    adopt, build_window = CoupledHeadSiblingsDecoder.adopt, CoupledHeadSiblingsDecoder.build_window
    seen = {"calls": 0, "windows": 0}

    def checked_adopt(self, state, call, redraft):
        before = [(d.clone(), q.clone()) for d, q in zip(state.carried, state.carried_q)]
        adopt(self, state, call, redraft)
        for (d, q), d_after, q_after in zip(before, state.carried, state.carried_q):
            assert torch.equal(d, d_after) and torch.equal(q, q_after)
        for b, n in enumerate(state.committed):
            for m, entries in state.speculations[b].items():
                assert m >= n and toy.layout.forced[m] < 0
                assert all(q[draft] > 0 for _, draft, q in entries)  # each a draw from the q it waits with
        seen["calls"] += 1

    def checked_window(self, state, cached, widths, call):
        win = build_window(self, state, cached, widths, call)
        if win.has_sibling.any():
            assert win.sibling_q is not None
            rows, k, i = win.has_sibling.nonzero(as_tuple=True)
            assert (win.sibling_q[rows, k, i].gather(1, win.siblings[rows, k, i][:, None]) > 0).all()
            seen["windows"] += 1
        return win

    monkeypatch.setattr(CoupledHeadSiblingsDecoder, "adopt", checked_adopt)
    monkeypatch.setattr(CoupledHeadSiblingsDecoder, "build_window", checked_window)
    res = CoupledHeadSiblingsDecoder(heads=heads).generate(toy, PROMPTS, SAMPLED, gens())
    assert seen["calls"] > 0 and seen["windows"] > 0
    assert all(n > 0 for n in res.extras["branch_commits"]), res.extras["branch_commits"]
    assert all(n > 0 for n in res.extras["head_forwards"])


def test_siblings_are_committed_on_the_audits_micro_model():
    """The audit below tests something: at its settings (window 4, random heads) siblings are committed."""
    micro = MicroAdapter()
    prompts = [Prompt(f"m{i}", "a") for i in range(64)]
    decoder = CoupledHeadSiblingsDecoder(heads={"weights": "random"}, window=4)
    res = decoder.generate(micro, prompts, SamplingConfig(cfg_scale=2.0), gens(prompts))
    assert sum(res.extras["branch_commits"]) > 0


def test_replace_missing_keeps_every_carried_draft_and_only_extends_them(toy, monkeypatch):
    adopt = SJDPACHeadsDecoder.adopt
    extended = []

    def checked_adopt(self, state, call, redraft):
        before = [d.clone() for d in state.carried]
        adopt(self, state, call, redraft)
        for d, after in zip(before, state.carried):
            assert torch.equal(after[: len(d)], d)
            extended.append(len(after) > len(d))
        assert all(len(room) == len(d) for room, d in zip(state.carried_room, state.carried))

    monkeypatch.setattr(SJDPACHeadsDecoder, "adopt", checked_adopt)
    SJDPACHeadsDecoder(heads=HEADS, replace="missing").generate(toy, PROMPTS, SAMPLED, gens())
    assert any(extended)


@pytest.mark.slow
def test_the_audit_catches_head_siblings_tested_as_if_drawn_from_the_chain_drafts_q(run_audit, monkeypatch):
    """The deliberate slip: each head sibling verified as a sibling drawn without replacement from the chain draft's
    q (SJD-PAC's rule), not with the q it was drawn from. The same audit passes the decoder (tests/audit)."""
    import sjd.decoders.head_siblings

    cls = sjd.decoders.head_siblings.CoupledHeadSiblingsDecoder
    own = cls.row_siblings
    monkeypatch.setattr(cls, "row_siblings", lambda self, *a: (own(self, *a)[0], None))
    report = run_audit(["decoder=csjd_head_siblings", "n_samples=4000"])
    assert report["p_value"] < 1e-6, report
