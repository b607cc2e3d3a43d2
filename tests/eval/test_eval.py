"""Quality metrics: protocols, FID with the toy feature network, CLIP score with the toy CLIP and
with a transformers CLIP (tiny, random, saved locally), reference caching, and config errors."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.sjd import SJDDecoder
from sjd.eval.clip_score import clip_score
from sjd.eval.fid import add_images, build_metric, toy_reference_images
from sjd.eval.protocols import preprocess
from sjd.eval.quality import check_eval, evaluate
from sjd.harness.prompts import load_prompt_file
from sjd.toy.scenes import scene_batch
from sjd.toy.tokenizer import N_CODES, decode_codes
from sjd.toy.training import HELDOUT_INDEX


def fid_of(real: np.ndarray, fake: np.ndarray, protocol: str = "sjd") -> float:
    metric = build_metric("toy")
    add_images(metric, real, protocol, real=True)
    add_images(metric, fake, protocol, real=False)
    return float(metric.compute())


@pytest.fixture(scope="module")
def real_images():
    return toy_reference_images(400)


@pytest.fixture(scope="module")
def model_samples(toy):
    prompts = load_prompt_file("sjd/assets/prompts/toy.tsv")
    gens = make_generators(0, [p.prompt_id for p in prompts], torch.device("cpu"))
    res = SJDDecoder(window=16).generate(toy, prompts, SamplingConfig(cfg_scale=3.0), gens)
    return toy.decode_images(res.tokens), [p.text for p in prompts]


def test_protocols_resize_and_crop():
    img = np.zeros((2, 60, 90, 3), np.uint8)
    img[:, :, 15:75] = 255  # the centre square is white
    sjd, clean = preprocess(img, "sjd"), preprocess(img, "clean")
    assert sjd.shape == (2, 3, 299, 299) and sjd.dtype == torch.uint8
    assert clean.shape == (2, 3, 256, 256) and clean.float().mean() > 250  # the crop kept the centre only
    with pytest.raises(ValueError, match="protocol"):
        preprocess(img, "fancy")


def test_fid_of_a_set_against_itself_is_zero_and_grows_with_noise(real_images):
    a, b = real_images[:200], real_images[200:]
    assert fid_of(a, a) == pytest.approx(0.0, abs=1e-2)
    rng = np.random.default_rng(0)
    scores = []
    for sigma in (0, 20, 60):
        noisy = np.clip(b.astype(float) + rng.normal(0, sigma, b.shape), 0, 255).astype(np.uint8)
        scores.append(fid_of(a, noisy))
    assert scores[0] < scores[1] < scores[2], scores


@pytest.mark.slow  # a retrain, a rebuild or a large fixture: make test runs it, the edit loops do not
def test_fid_ranks_model_samples_far_above_random_token_images(real_images, model_samples):
    samples, _ = model_samples
    rng = np.random.default_rng(1)
    random_tokens = decode_codes(rng.integers(0, N_CODES, (len(samples), 12, 12)))
    model_fid, random_fid = fid_of(real_images, samples), fid_of(real_images, random_tokens)
    assert model_fid * 5 < random_fid, (model_fid, random_fid)


def test_clip_score_orders_matched_captions_above_shuffled(model_samples):
    scenes = scene_batch(0, HELDOUT_INDEX + 3, 64)
    real = decode_codes(np.stack([s.codes for s in scenes]))
    captions = [s.caption for s in scenes]
    for images, caps in ((real, captions), model_samples):
        matched = clip_score(images, caps)
        shuffled = clip_score(images, caps[1:] + caps[:1])
        assert matched > shuffled + 5, (matched, shuffled)


def test_hf_clip_backend_runs_through_torchmetrics(tmp_path):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = {
        "<|startoftext|>": 0,
        "<|endoftext|>": 1,
        **{t: i + 2 for i, t in enumerate(letters + [x + "</w>" for x in letters])},
    }
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(tmp_path / "clip")
    config = CLIPConfig(
        text_config={"vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "max_position_embeddings": 32},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )  # fmt: skip
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(tmp_path / "clip")
    images = np.random.default_rng(0).integers(0, 255, (3, 40, 40, 3), dtype=np.uint8)
    score = clip_score(images, ["a red cat", "blue sky", "green"], backend="hf", model=str(tmp_path / "clip"))
    assert 0.0 <= score <= 100.0


def test_run_quality_is_cached_and_recorded(toy, tmp_path, model_samples):
    prompts = load_prompt_file("sjd/assets/prompts/toy.tsv")[:4]
    gens = make_generators(0, [p.prompt_id for p in prompts], torch.device("cpu"))
    res = SJDDecoder(window=16).generate(toy, prompts, SamplingConfig(cfg_scale=3.0), gens)
    samples = pd.DataFrame(
        {"decoder": "sjd", "prompt": [p.text for p in prompts], "tokens": [t.tolist() for t in res.tokens]}
    )
    eval_cfg = {"fid": {"extractor": "toy", "protocol": "sjd", "reference": "toy_heldout", "reference_n": 200},
                "clip": {"backend": "toy", "protocol": "sjd"}}  # fmt: skip
    first = evaluate(eval_cfg, samples, toy, tmp_path).iloc[0]
    ref = tmp_path / "fid_reference"
    (cached,) = ref.glob("*.npz")
    stamp = cached.stat().st_mtime_ns
    second = evaluate(eval_cfg, samples, toy, tmp_path).iloc[0]
    assert cached.stat().st_mtime_ns == stamp  # reused, not recomputed
    assert first["fid"] == pytest.approx(second["fid"]) and first["fid"] > 0
    assert first["fid_protocol"] == "sjd" and first["clip_protocol"] == "sjd" and first["clip"] > 0


def test_eval_configs_fail_before_any_model_with_the_key_to_set(compose_cfg, tmp_path):
    cfg = compose_cfg(["model=lumina", "eval=coco_sjd"])
    with pytest.raises(ValueError, match="eval.fid.inception_weights"):
        check_eval(cfg.eval)
    cfg = compose_cfg(["eval=toy", f"eval.fid.reference={tmp_path / 'nope.npz'}"])
    with pytest.raises(FileNotFoundError, match="eval.fid.reference"):
        check_eval(cfg.eval)


def test_quality_vs_speedup_plot(tmp_path):
    from studies.figures import quality_vs_speedup

    table = pd.DataFrame(
        {"model": ["toy"] * 3, "decoder": ["ar", "sjd", "pjd"], "latency_speedup": [1.0, 3.2, 3.0],
         "fid": [1.0, 1.1, 2.5], "clip": [30.0, 30.1, 28.0], "lossless_expected": [True, True, False]}
    )  # fmt: skip
    out = quality_vs_speedup(table, tmp_path / "q.png")
    assert out.stat().st_size > 1000
