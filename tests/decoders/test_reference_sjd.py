"""`SJDDecoder` against SJD on one screen (sjd/decoders/reference.py), token for token at fixed seeds.

The reference decodes one image in one function; the decoder decodes a ragged batch through its phases.
With random drafts and the token rule they must commit the same tokens in the same forwards, under the
harness schedule and the official one (with the official sampler's drafts at forced positions), on the
toy (a batch of three against three single decodes) and on a Lumina-mGPT stand-in, whose official schedule
follows its model family's rule (one prompt a batch there: its padded ragged batches round the attention
differently in the last bits, so a row's tokens drift from its single decode after some hundred positions)."""

import pytest
import torch

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.reference import speculative_jacobi_decode
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.prompts import load_prompt_file
from sjd.types import Prompt

SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0)
TOY_PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:3]
SETTINGS = [  # (window, schedule, forced_drafts)
    (4, "harness", True),
    (16, "harness", True),
    (16, "official", False),
    (8, "official", True),
]

pytestmark = pytest.mark.usefixtures("one_thread")


def _both(adapter, prompts: list[Prompt], seed: int, window: int, schedule: str, forced: bool):
    decoder = SJDDecoder(window=window, schedule=schedule, forced_drafts=forced)
    decoder.check(adapter)
    batched = decoder.generate(adapter, prompts, SAMPLED, make_generators(seed, [p.prompt_id for p in prompts],
                                                                          adapter.device))  # fmt: skip
    for b, prompt in enumerate(prompts):
        (generator,) = make_generators(seed, [prompt.prompt_id], adapter.device)
        tokens, committed = speculative_jacobi_decode(adapter, prompt, SAMPLED, generator, window, schedule, forced)
        yield (
            prompt.prompt_id,
            (batched.tokens[b], batched.accepted[b], batched.n_forward[b]),
            (tokens, committed, len(committed)),
        )


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("window", "schedule", "forced"), SETTINGS)
def test_sjd_decoder_commits_what_the_one_screen_reference_commits_on_the_toy(toy, seed, window, schedule, forced):
    for prompt_id, (tokens, accepted, n_forward), (ref_tokens, ref_committed, ref_forwards) in _both(
        toy, TOY_PROMPTS, seed, window, schedule, forced
    ):
        assert torch.equal(tokens, ref_tokens), prompt_id
        assert accepted == ref_committed and n_forward == ref_forwards, prompt_id
        assert max(accepted) > 1  # drafts were accepted: the loop was exercised, not only its AR steps


@pytest.mark.parametrize("schedule", ["harness", "official"])
def test_sjd_decoder_commits_what_the_one_screen_reference_commits_on_a_lumina_standin(schedule):
    from sjd.standin.adapter import StandinLuminaAdapter

    adapter = StandinLuminaAdapter(asset="standin_lumina_512_cal", name="standin_lumina_512_cal")
    prompts = [Prompt("s0", "a red house by the sea"), Prompt("s1", "two cats")]
    for prompt in prompts:
        for prompt_id, got, ref in _both(adapter, [prompt], 0, 16, schedule, schedule == "harness"):
            assert torch.equal(got[0], ref[0]) and got[1:] == ref[1:], prompt_id
            assert max(got[1]) > 1
