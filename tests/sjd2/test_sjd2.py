"""SJD2 on the noise-aware toy checkpoint: the checkpoint denoises, the decode loop is exact
where it must be, and missing capabilities or checkpoints are named."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.sjd2 import SJD2Decoder
from sjd.harness.prompts import load_prompt_file
from sjd.sjd2.toy import ToySJD2Adapter
from sjd.sjd2.toy_finetune import TOY, ToyFineTuneSettings, finetune_toy
from sjd.sjd2.toy_net import N_LEVELS, load_noise_aware
from sjd.toy.model import TEXT_CONTEXT
from sjd.toy.tokenizer import ToyVocab
from sjd.toy.training import HELDOUT_INDEX, image_targets, make_batch

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:4]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)


@pytest.fixture(scope="module")
def toy_sjd2():
    return ToySJD2Adapter()


def gens(prompts, seed=0):
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


def test_the_fine_tuned_model_reads_noisy_embeddings():
    """Next-token loss over a noisy segment falls as the segment's noise level falls: the
    model uses what a partly denoised draft says, which is what SJD2 relies on."""
    model, _ = load_noise_aware(ROOT / "sjd" / "assets" / "toy_sjd2")
    batch = make_batch(ToyVocab(), 1, HELDOUT_INDEX + 7, 32, 0.0)
    inputs, targets = batch[:, :-1], image_targets(batch)
    segment = slice(TEXT_CONTEXT + 20, TEXT_CONTEXT + 52)
    noise = torch.randn(inputs.shape + (model.config.hidden_size,), generator=torch.Generator().manual_seed(0))
    losses = {}
    with torch.no_grad():
        for level in (N_LEVELS - 1, N_LEVELS // 2, 0):
            levels = torch.zeros_like(inputs)
            levels[:, segment] = level
            logits = model(model.noisy(model.clean_embeddings(inputs), levels, noise), levels).logits
            losses[level] = F.cross_entropy(logits[:, segment].flatten(0, 1), targets[:, segment].flatten()).item()
    assert losses[0] < losses[N_LEVELS // 2] < losses[N_LEVELS - 1] - 0.05, losses


@pytest.mark.parametrize("forced_drafts", [True, False])
def test_sjd2_with_one_denoising_step_equals_greedy_ar(toy_sjd2, forced_drafts):
    """denoise_steps=1: every carried draft enters clean, so the committed tokens only ever see clean
    tokens; without forced drafts a forced slot enters as noise and ends the verified prefix."""
    ar = ARDecoder().generate(toy_sjd2, PROMPTS, GREEDY, gens(PROMPTS))
    decoder = SJD2Decoder(window=16, denoise_steps=1, forced_drafts=forced_drafts)
    res = decoder.generate(toy_sjd2, PROMPTS, GREEDY, gens(PROMPTS, seed=3))
    assert torch.equal(ar.tokens, res.tokens)
    assert all(n < toy_sjd2.layout.n_tokens for n in res.n_forward)


def test_sjd2_without_a_noise_aware_model_is_refused_at_start(toy):
    with pytest.raises(ValueError, match=r"'sjd2' needs model capabilities \['embeds'\].*'toy'.*model=toy_sjd2"):
        SJD2Decoder().check(toy)
    with pytest.raises(ValueError, match="not a noise-aware checkpoint.*model.adapter.weights"):
        ToySJD2Adapter(weights=str(ROOT / "sjd" / "assets" / "toy"))
    with pytest.raises(ValueError, match="decoder.denoise_steps"):
        SJD2Decoder(denoise_steps=0)


@pytest.mark.slow
def test_the_toy_finetune_writes_a_loadable_checkpoint(tmp_path):
    """What `scripts/finetune_sjd2.py --steps 2 --batch-size 4` runs (sjd.sjd2.toy_finetune.finetune_toy)."""
    out = tmp_path / "ckpt"
    meta = finetune_toy(ToyFineTuneSettings(steps=2, batch_size=4), TOY, out)
    adapter = ToySJD2Adapter(weights=str(out))
    assert adapter.meta["train"] == meta["train"] and meta["train"]["steps"] == 2
    assert meta["base"] == "sjd/assets/toy"
