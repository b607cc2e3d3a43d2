"""The SJD2 fine-tune recipe for real models (`sjd.sjd2.finetune`, run by scripts/finetune_sjd2_hf.py) on
tiny random Lumina-mGPT and Emu3 checkpoints: the shard format, the objective's noise plan (image codes
only, never the prompt), and a 3-step run whose checkpoint loads through the noise-aware adapter and decodes."""

import math
import warnings

import pytest
import torch
from test_sjd2_hf import PROMPTS, emu3_base, gens, lumina_base

from sjd.core.sampling import SamplingConfig
from sjd.decoders.ar import ARDecoder
from sjd.decoders.sjd2 import SJD2Decoder
from sjd.sjd2.data import image_stream, prompt_row, read_shards, uncond_row, write_shard
from sjd.sjd2.emu3 import Emu3SJD2Adapter
from sjd.sjd2.finetune import FineTuneSettings, finetune, shard_paths
from sjd.sjd2.lumina import LuminaSJD2Adapter
from sjd.sjd2.objective import IGNORE, make_batch, noise_plan
from sjd.types import Prompt

CAPTIONS = ["a red fox", "two cats on a mat", "a bowl of fruit", "snow"]
FAMILIES = {
    "lumina": (lumina_base, LuminaSJD2Adapter, 64),  # 2 x 2 grids = 4 x 4 codes
    "emu3": (emu3_base, Emu3SJD2Adapter, 8),  # 8 px / the tiny VQ's factor 2 = 4 x 4 codes
}

pytestmark = pytest.mark.usefixtures("one_thread")


def synthetic_examples(adapter, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    layout = adapter.layout
    grids = [torch.randint(len(adapter.vocab.code_ids), (layout.height, layout.width), generator=g) for _ in CAPTIONS]
    streams = [image_stream(layout, adapter.vocab.code_ids, codes) for codes in grids]
    return [(prompt_row(adapter, c), stream) for c, stream in zip(CAPTIONS, streams)]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def base(request, tmp_path_factory):
    """(family, base checkpoint directory, shard path, the base adapter)."""
    family = request.param
    adapter, tokenizer = FAMILIES[family][0]()
    directory = tmp_path_factory.mktemp(f"{family}_base")
    adapter.model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    shard = directory.parent / f"{family}_shard.safetensors"
    write_shard(shard, synthetic_examples(adapter), family)
    return family, directory, shard, adapter


def test_shards_round_trip_and_are_checked_against_the_layout(base, tmp_path):
    family, _, shard, adapter = base
    examples = synthetic_examples(adapter)
    assert read_shards([shard], family, adapter.layout) == examples
    ids, lengths = adapter.prompt_batch([Prompt("x", CAPTIONS[0])], with_uncond=False)
    assert examples[0][0] == ids[0, ids.shape[1] - lengths[0] :].tolist()  # what the model reads at decode time
    other = "emu3" if family == "lumina" else "lumina"
    with pytest.raises(ValueError, match=f"a shard for '{family}'"):
        read_shards([shard], other, adapter.layout)
    bad = [(p, [s[1], *s[1:]]) for p, s in examples]  # a code where the first forced token belongs
    if adapter.layout.forced[0] >= 0:  # Lumina: begin-of-image is forced
        write_shard(tmp_path / "bad.safetensors", bad, family)
        with pytest.raises(ValueError, match="does not follow the model's layout"):
            read_shards([tmp_path / "bad.safetensors"], family, adapter.layout)


def test_batches_supervise_the_stream_and_noise_only_image_codes(base):
    family, _, _, adapter = base
    examples = synthetic_examples(adapter)
    uncond = uncond_row(adapter)
    g = torch.Generator().manual_seed(0)
    batch = make_batch(examples, [0, 1, 2, 3], uncond, cfg_dropout=0.5, g=g)
    n_tokens = adapter.layout.n_tokens
    dropped = 0
    for b in range(4):
        start = int(batch.image_start[b])
        prompt = batch.inputs[b, :start].tolist()
        assert prompt in (examples[b][0], uncond)
        dropped += prompt == uncond
        assert batch.targets[b, start - 1 : start - 1 + n_tokens].tolist() == examples[b][1]
        assert (batch.targets[b, : start - 1] == IGNORE).all() and (
            batch.targets[b, start - 1 + n_tokens :] == IGNORE
        ).all()
    assert 0 < dropped < 4  # this seed drops some captions, not all
    levels = noise_plan(batch, adapter.layout.free_tokens, 32, max_segment=6, clean_frac=0.0, g=g)
    noisy = levels > 0
    assert noisy.any() and (levels < 32).all()
    assert adapter.layout.free_tokens[batch.inputs[noisy]].all()  # image codes only: no prompt, no forced token
    assert (noisy.long().argmax(1)[noisy.any(1)] >= batch.image_start[noisy.any(1)]).all()
    assert all(int(row.nonzero().max() - row.nonzero().min()) < 6 for row in noisy if row.any())
    assert not noise_plan(batch, adapter.layout.free_tokens, 32, 6, clean_frac=1.0, g=g).any()


def test_a_three_step_fine_tune_writes_a_checkpoint_that_loads_and_decodes(base, tmp_path):
    family, directory, shard, _ = base
    out = tmp_path / "ckpt"
    settings = FineTuneSettings(resolution=FAMILIES[family][2], steps=3, batch_size=2, grad_accum=1, lr=1e-3,
                                warmup=1, max_segment=8, cfg_dropout=0.5, log_every=100)  # fmt: skip
    meta = finetune(family, str(directory), [str(shard)], out, settings)
    assert len(meta["train"]["losses"]) == 3 and all(math.isfinite(x) for x in meta["train"]["losses"])

    cls = FAMILIES[family][1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lumina without a VQGAN warns that images cannot be decoded
        adapter = cls(weights=str(out), resolution=FAMILIES[family][2], dtype="float32")
    assert adapter.noise_meta["train"]["steps"] == 3 and adapter.noise_meta["base_model"] == str(directory)
    assert adapter.noise_path.time_embed.weight.abs().sum() > 0  # the timestep embedding was trained
    greedy = SamplingConfig(cfg_scale=3.0, temperature=0.0)
    ar = ARDecoder().generate(adapter, PROMPTS, greedy, gens(PROMPTS))
    res = SJD2Decoder(window=8, denoise_steps=1).generate(adapter, PROMPTS, greedy, gens(PROMPTS, seed=3))
    assert torch.equal(ar.tokens, res.tokens)
    sampled = SJD2Decoder(window=8, denoise_steps=4).generate(
        adapter, PROMPTS, SamplingConfig(cfg_scale=3.0, temperature=1.0), gens(PROMPTS)
    )
    forced = adapter.layout.forced
    assert (sampled.tokens[:, forced >= 0] == forced[forced >= 0]).all()
    assert adapter.layout.free_tokens[sampled.tokens[:, forced < 0]].all()


def test_the_recipe_refuses_missing_shards(tmp_path):
    with pytest.raises(FileNotFoundError, match="--data"):
        shard_paths([str(tmp_path / "none.safetensors")])
