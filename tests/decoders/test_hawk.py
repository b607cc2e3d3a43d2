"""Hawk (sjd.decoders.hawk): exact at temperature 0 and in distribution, its vertical speculations committed, the
rule that keeps them exact, and its start-up checks."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.core.verify import recursive_rejection
from sjd.decoders.ar import ARDecoder
from sjd.decoders.hawk import HawkDecoder
from sjd.harness.prompts import load_prompt_file

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = load_prompt_file(ROOT / "sjd/assets/prompts/toy.tsv")[:3]
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0)
GREEDY = dataclasses.replace(SAMPLED, temperature=0.0)
TOY_HEADS = {"weights": "sjd/assets/spatial_heads_toy"}

pytestmark = pytest.mark.usefixtures("one_thread")


def gens(seed: int = 0) -> list[torch.Generator]:
    return make_generators(seed, [p.prompt_id for p in PROMPTS], torch.device("cpu"))


@pytest.mark.parametrize("heads", [TOY_HEADS, {"weights": "random"}], ids=["shipped", "random"])
def test_greedy_hawk_is_greedy_ar(toy, heads):
    ar = ARDecoder().generate(toy, PROMPTS, GREEDY, gens())
    hawk = HawkDecoder(heads=heads)
    hawk.check(toy)
    assert torch.equal(hawk.generate(toy, PROMPTS, GREEDY, gens()).tokens, ar.tokens)


def test_vertical_speculations_are_committed_and_save_forwards(toy):
    """The pool is live: some forwards commit a speculation drawn a row earlier, and without the vertical heads
    (vertical=0: the chain alone) the same decode takes more forwards."""
    pooled = HawkDecoder(heads=TOY_HEADS).generate(toy, PROMPTS, SAMPLED, gens())
    chain = HawkDecoder(heads=TOY_HEADS, vertical=0).generate(toy, PROMPTS, SAMPLED, gens())
    assert all(n > 0 for n in pooled.extras["branch_commits"]), pooled.extras["branch_commits"]
    assert not any(chain.extras["branch_commits"])
    assert sum(pooled.n_forward) < sum(chain.n_forward)
    assert set(pooled.extras["heads"]) == {6} and all(n > 0 for n in pooled.extras["head_forwards"])


def test_recursive_rejection_over_independent_drafts_gives_p():
    """Two candidates drawn on their own from different q's after a rejected chain draft: the committed token is
    distributed as the target left, whatever the q's."""
    target = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    q = torch.tensor([[0.1, 0.0, 0.3, 0.3, 0.3], [0.0, 0.6, 0.1, 0.1, 0.2]])
    n = 60_000
    g = torch.Generator().manual_seed(0)
    siblings = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(2)], 1)
    u = torch.rand(n, 2, generator=g)
    picked, left = recursive_rejection(
        target.expand(n, 5), siblings, q.expand(n, 2, 5), torch.ones(n, 2, dtype=torch.bool), u
    )
    rows = torch.arange(n)
    fallback = torch.multinomial(left, 1, generator=g)[:, 0]
    tokens = torch.where(picked >= 0, siblings[rows, picked.clamp(min=0)], fallback)
    freq = torch.bincount(tokens, minlength=5).float() / n
    assert (freq - target).abs().sum() / 2 < 0.01, freq
    assert 0 < (picked >= 0).float().mean() < 1


def test_heads_without_the_rows_below_are_refused_naming_the_key_and_the_command(toy):
    hawk = HawkDecoder(heads={"weights": "sjd/assets/heads_toy"})  # offsets 1-4: no head a row below
    with pytest.raises(ValueError, match=r"decoder.heads.weights.*heads.vertical=2"):
        hawk.check(toy)


def test_on_rows_shorter_than_the_chain_a_row_below_within_reach_is_a_chain_draft_not_a_speculation(toy):
    hawk = HawkDecoder(heads={"weights": "random"}, horizontal=toy.layout.row_stride)
    assert hawk.vertical_offsets(toy.layout) == (2 * toy.layout.row_stride,)
    hawk.check(toy)


@pytest.mark.slow
@pytest.mark.parametrize("decoder", ["hawk", "ssd"])
def test_the_documented_command_runs_with_the_shipped_heads(tmp_path, decoder):
    """`python run.py decoder=NAME model=standin_lumina_512_cal`, at one prompt without a warm-up batch."""
    command = [sys.executable, str(ROOT / "run.py"), f"decoder={decoder}", "model=standin_lumina_512_cal",
               "prompts.n=1", "warmup=0", "results_csv=null", "logger=csv", "save_images=false",
               f"hydra.run.dir={tmp_path}"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"\n{decoder:>7}" in done.stdout or f" {decoder} " in done.stdout, done.stdout[-1000:]


@pytest.mark.slow
def test_the_audit_catches_speculations_tested_as_if_drawn_from_the_chain_drafts_q(run_audit, monkeypatch):
    """The slip a tree decoder built on SJD-PAC would make: a speculation verified as a sibling drawn without
    replacement from the chain draft's q, not with the q it was drawn from. Caught on the micro model."""
    import sjd.decoders.hawk

    own = sjd.decoders.hawk.HawkDecoder.row_siblings
    monkeypatch.setattr(sjd.decoders.hawk.HawkDecoder, "row_siblings", lambda self, *a: (own(self, *a)[0], None))
    report = run_audit(["decoder=hawk", "n_samples=20000"])
    assert report["p_value"] < 1e-5, report
