"""The shipped toy model: its data, its tokenizer, its checkpoint, and evidence that it learned."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.toy.scenes import COLOURS, scene_batch
from sjd.toy.tokenizer import ToyVocab, decode_codes, dominant_colours, encode_image
from sjd.toy.training import ToyTrainSettings, train_toy
from sjd.types import Prompt

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "sjd" / "assets" / "toy"


def test_scenes_are_deterministic_and_tokenizer_round_trips():
    a, b = scene_batch(5, 3, 8), scene_batch(5, 3, 8)
    assert [s.caption for s in a] == [s.caption for s in b]
    codes = np.stack([s.codes for s in a])
    assert np.array_equal(codes, np.stack([s.codes for s in b]))
    assert np.array_equal(encode_image(decode_codes(codes)), codes)
    vocab = ToyVocab()
    seq = vocab.image_sequence(codes[0])
    assert len(seq) == 1 + 12 * 13 + 1 and seq[0] == vocab.boi and seq[-1] == vocab.eoi
    assert np.array_equal(vocab.codes_from_sequence(torch.tensor([seq]))[0], codes[0])


def test_captions_say_what_the_pixels_show():
    for scene in scene_batch(9, 0, 32):
        assert dominant_colours(decode_codes(scene.codes))[0] == scene.background


def test_checkpoint_is_safetensors_within_budget():
    weights = ASSETS / "model.safetensors"
    assert weights.stat().st_size <= 25 * 2**20
    state = load_file(str(weights))  # no pickle involved
    meta = json.loads((ASSETS / "config.json").read_text())
    assert meta["train"]["heldout_loss"] < meta["train"]["final_train_loss"] + 0.2
    assert any(k.endswith("embed_tokens.weight") for k in state)


@pytest.mark.slow
def test_training_script_is_deterministic(tmp_path):
    """`python scripts/train_toy.py` and sjd.toy.training.train_toy, with the same settings, write the same
    weights bit for bit: the run is a pure function of its settings, and the script adds nothing to it."""
    script = [sys.executable, str(ROOT / "scripts" / "train_toy.py"), "--steps", "3", "--batch-size", "4",
              "--out", str(tmp_path / "script")]  # fmt: skip
    subprocess.run(script, check=True, capture_output=True)
    meta = train_toy(ToyTrainSettings(steps=3, batch_size=4), tmp_path / "function")
    outs = [load_file(str(tmp_path / name / "model.safetensors")) for name in ("script", "function")]
    assert outs[0].keys() == outs[1].keys() and all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])
    recorded = json.loads((tmp_path / "script" / "config.json").read_text())["train"]
    assert {k: v for k, v in recorded.items() if k != "minutes"} == {
        k: v for k, v in meta["train"].items() if k != "minutes"
    }


@pytest.fixture(scope="module")
def single_object_samples(toy):
    """Sampled images (default settings: CFG 3, temperature 1) for held-out one-object captions."""
    rng = np.random.default_rng(123)
    prompts = []
    for i in range(24):
        bg, obj = rng.choice(len(COLOURS), 2, replace=False)
        shape = ("circle", "square", "triangle")[i % 3]
        text = f"large {COLOURS[obj]} {shape} center on {COLOURS[bg]}"
        prompts.append(Prompt(f"t{i}", text))
    res = ARDecoder().generate(
        toy, prompts, SamplingConfig(), make_generators(0, [p.prompt_id for p in prompts], torch.device("cpu"))
    )
    return prompts, toy.decode_images(res.tokens)


def test_samples_follow_their_captions_far_above_chance(single_object_samples):
    prompts, images = single_object_samples
    bg_hits = obj_hits = 0
    for prompt, img in zip(prompts, images):
        words = prompt.text.split()
        colours = dominant_colours(img)
        bg_hits += colours[0] == words[-1]
        obj_hits += len(colours) > 1 and colours[1] == words[1]
    n = len(prompts)
    # Chance: 1/8 for the background, about 1/7 for the object colour.
    assert bg_hits / n >= 0.9, f"background colour right in {bg_hits}/{n}"
    assert obj_hits / n >= 0.6, f"object colour right in {obj_hits}/{n}"
