"""SSD (sjd.decoders.ssd): its per-position rule, where it is exact and where it is not, and its start-up checks."""

import dataclasses
from pathlib import Path

import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.ssd import SSDDecoder, independent_accept
from sjd.harness.decoder_configs import decoder_config as load_decoder_config
from sjd.harness.prompts import load_prompt_file

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = load_prompt_file(ROOT / "sjd/assets/prompts/toy.tsv")[:3]
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0)
GREEDY = dataclasses.replace(SAMPLED, temperature=0.0)
RANDOM_HEADS = {"weights": "random"}

pytestmark = pytest.mark.usefixtures("one_thread")


def gens(seed: int = 0) -> list[torch.Generator]:
    return make_generators(seed, [p.prompt_id for p in PROMPTS], torch.device("cpu"))


def test_one_position_kept_or_redrawn_is_a_sample_of_p():
    """For one position on its own the rule is speculative sampling: the token is distributed as p, whatever q."""
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.1, 0.3, 0.5])
    n = 40_000
    g = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(q, n, replacement=True, generator=g)
    tokens, _ = independent_accept(p.expand(n, 4), drafts, q.expand(n, 4), g)
    freq = torch.bincount(tokens, minlength=4).float() / n
    assert (freq - p).abs().sum() / 2 < 0.01, freq
    tokens, kept = independent_accept(p.expand(3, 4), torch.tensor([0, 0, 0]), p.expand(3, 4), g)
    assert kept.tolist() == [True] * 3 and tokens.tolist() == [0, 0, 0]  # q = p: every draft is kept


def test_one_code_a_block_one_round_no_row_below_is_greedy_ar(toy):
    """window 1, one round and one active row: every committed code is a sample of the target's p given the
    committed tokens (the block's one position and the token after it), so at temperature 0 it is greedy AR."""
    ar = ARDecoder().generate(toy, PROMPTS, GREEDY, gens())
    one = SSDDecoder(window=1, rows_below=0, rounds=1, heads=RANDOM_HEADS)
    one.check(toy)
    assert torch.equal(one.generate(toy, PROMPTS, GREEDY, gens()).tokens, ar.tokens)


def test_blocks_and_rows_in_parallel_take_fewer_forwards_and_are_not_ar(toy):
    """The published settings commit a block per row and round, rows at once: far fewer forwards than AR, and at
    temperature 0 a code after a replaced one was verified on the replaced draft, so the image is not greedy AR's."""
    ar = ARDecoder().generate(toy, PROMPTS, GREEDY, gens())
    ssd = SSDDecoder(heads=RANDOM_HEADS)
    ssd.check(toy)
    greedy = ssd.generate(toy, PROMPTS, GREEDY, gens())
    assert not torch.equal(greedy.tokens, ar.tokens)
    sampled = ssd.generate(toy, PROMPTS, SAMPLED, gens())
    assert max(sampled.n_forward) * 3 < min(ARDecoder().generate(toy, PROMPTS, SAMPLED, gens()).n_forward)
    # a block commits only on its last round: every second forward of a row commits nothing
    assert all(a == 0 for a in sampled.accepted[0][1:3:2])
    assert sampled.extras["head_forwards"] and all(n > 0 for n in sampled.extras["head_forwards"])


def test_the_rounds_and_rows_are_settings_that_change_the_steps(toy):
    one_round = SSDDecoder(rounds=1, heads=RANDOM_HEADS).generate(toy, PROMPTS, SAMPLED, gens())
    two_rounds = SSDDecoder(rounds=2, heads=RANDOM_HEADS).generate(toy, PROMPTS, SAMPLED, gens())
    one_row = SSDDecoder(rounds=1, rows_below=0, heads=RANDOM_HEADS).generate(toy, PROMPTS, SAMPLED, gens())
    assert sum(one_round.n_forward) < sum(two_rounds.n_forward)
    assert sum(one_round.n_forward) < sum(one_row.n_forward)


def test_heads_without_a_below_head_are_refused_naming_the_key(toy):
    ssd = SSDDecoder(heads={"weights": "sjd/assets/heads_toy"})  # offsets 1-4: no head a row below
    with pytest.raises(ValueError, match=r"decoder.heads.weights.*heads.vertical=1"):
        ssd.check(toy)


@pytest.mark.parametrize("decoder", ["ssd", "hawk"])
def test_a_model_without_spatial_heads_stops_at_start_up_naming_the_key(decoder):
    """Both spatial-heads decoders (SSD, and Hawk, sjd.decoders.hawk) read `model.spatial_heads`."""
    run = OmegaConf.create(
        {
            "decoder": load_decoder_config(decoder),
            "model": OmegaConf.load(ROOT / "conf/model/standin_lumina_768.yaml"),
        }
    )
    with pytest.raises(InstantiationException, match="needs draft heads: set `decoder.heads.weights`"):
        instantiate(run.decoder)


def test_a_layout_without_end_of_line_tokens_is_refused():
    adapter = instantiate(OmegaConf.load(ROOT / "conf/model/standin_llamagen_512.yaml").adapter, device="cpu")
    with pytest.raises(ValueError, match="end-of-line"):
        SSDDecoder(heads=RANDOM_HEADS).check(adapter)


def test_each_token_records_the_row_of_its_block_that_committed_it(toy):
    """`block_depth`: -1 exactly at the tokens no block commits (the forced ones, and position 0 from the prefill),
    0 in the top active row, 1, 2, ... in the rows below; the image's first row is always the top row, the second
    row's first block drafted a row below it; one row in flight has no rows below."""
    layout = toy.layout
    no_block = ((layout.forced >= 0) | (torch.arange(layout.n_tokens) == 0)).tolist()
    stacked = SSDDecoder(rows_below=2, heads=RANDOM_HEADS).generate(toy, PROMPTS, SAMPLED, gens(3))
    for depth in stacked.extras["block_depth"]:
        assert [d == -1 for d in depth] == no_block
        assert set(depth) == {-1, 0, 1, 2}
        first_row = depth[layout.first_code : layout.first_code + layout.width]
        second_row = depth[layout.first_code + layout.row_stride : layout.first_code + layout.row_stride + 5]
        assert set(first_row) == {0} and set(second_row) == {1}
    alone = SSDDecoder(rows_below=0, heads=RANDOM_HEADS).generate(toy, PROMPTS, SAMPLED, gens(3))
    assert all(set(depth) == {-1, 0} for depth in alone.extras["block_depth"])


def test_the_one_sample_audit_splits_an_ssd_runs_impossible_tokens_into_top_row_and_rows_below(toy):
    """On the toy with random heads and top-k sampling (so a kept draft can be impossible), the two shares weigh
    back to the audit's whole count of impossible tokens, every one of which a block committed."""
    import numpy as np

    from sjd.audit.teacher_forced import audit_images

    top_k = dataclasses.replace(SAMPLED, top_k=8)
    result = SSDDecoder(rows_below=2, rounds=1, heads=RANDOM_HEADS).generate(toy, PROMPTS, top_k, gens(5))
    depth = np.array(result.extras["block_depth"])
    out = audit_images(toy, PROMPTS, result.tokens, range(len(PROMPTS)), top_k, 4, depth)
    n_top, n_below = int((depth == 0).sum()), int((depth >= 1).sum())
    assert out["tf_zero_count"] > 0
    recombined = out["tf_zero_share_top_row"] * n_top + out["tf_zero_share_rows_below"] * n_below
    assert recombined == pytest.approx(out["tf_zero_count"])
    assert out["tf_zero_share_top_row"] != pytest.approx(out["tf_zero_share_rows_below"])
