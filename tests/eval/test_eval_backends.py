"""Real-model metric paths on tiny random networks, offline: the open_clip CLIP-score backend (score
equals the CLIP-score formula applied to open_clip's own features; weights from a file or from a
tag found in a local Hugging Face cache; clear errors for missing weights) and the Inception FID
extractor (random weights in torch-fidelity's layout, built through torchvision).

Random weights make no image-caption pairing meaningful, so the CLIP checks compare with the
formula computed by hand, not matched against shuffled captions."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file

import sjd.eval.fid as fid_module
from sjd.eval.clip_score import clip_score, import_open_clip, load_open_clip, resolve_open_clip_weights
from sjd.eval.fid import add_images, build_metric
from sjd.eval.protocols import preprocess
from sjd.eval.quality import check_eval
from sjd.torchvision_compat import _TorchvisionFinder, import_torchvision, install_torchvision_import_fix

TINY_CLIP = "sjd-test-tiny-clip"
TINY_CLIP_CONFIG = {  # ViT-B-32's layout at toy size; the real vocabulary so open_clip's tokenizer fits
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
CAPTIONS = ["a red cube", "two dogs on grass", "a blue sky over the sea", "an old clock", "green apples", "a cat"]


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    """(architecture name, checkpoint file, the model that was saved)."""
    open_clip = import_open_clip()
    folder = tmp_path_factory.mktemp("open_clip")
    (folder / f"{TINY_CLIP}.json").write_text(json.dumps(TINY_CLIP_CONFIG))
    open_clip.add_model_config(folder / f"{TINY_CLIP}.json")
    # with this seed the random features give scores of both signs and a positive mean, so the
    # per-pair clamp at 0 and the batch mean are both exercised (the test asserts it)
    torch.manual_seed(5)
    model = open_clip.create_model(TINY_CLIP, pretrained=None).eval()
    checkpoint = folder / "tiny_clip.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(checkpoint))
    return TINY_CLIP, str(checkpoint), model


@pytest.fixture
def no_downloads(monkeypatch):
    """Any attempt of open_clip to fetch weights fails the test."""
    open_clip = import_open_clip()

    def refuse(*args, **kwargs):
        raise AssertionError(f"download attempted: {args} {kwargs}")

    monkeypatch.setattr(open_clip.pretrained, "hf_hub_download", refuse)
    monkeypatch.setattr(open_clip.pretrained, "download_pretrained_from_url", refuse)


def hand_scores(model, images: np.ndarray, captions: list[str], protocol: str) -> torch.Tensor:
    """100 * cos(image, caption) per pair, from encode_image/encode_text with open_clip's default
    transform (resize, centre crop, OpenAI normalisation) and its tokenizer."""
    open_clip = import_open_clip()
    transform = open_clip.image_transform(TINY_CLIP_CONFIG["vision_cfg"]["image_size"], is_train=False)
    pil = [Image.fromarray(p.permute(1, 2, 0).numpy()) for p in preprocess(images, protocol)]
    with torch.no_grad():
        image_features = model.encode_image(torch.stack([transform(p) for p in pil]))
        text_features = model.encode_text(open_clip.tokenize(captions))
    return 100 * F.cosine_similarity(image_features, text_features, dim=-1)


def test_open_clip_score_is_the_clip_score_formula_on_open_clip_features(tiny_clip, no_downloads):
    name, checkpoint, model = tiny_clip
    images = np.random.default_rng(0).integers(0, 256, (len(CAPTIONS), 40, 56, 3), dtype=np.uint8)
    prefix = "A photo depicts "
    expected = hand_scores(model, images, [prefix + c for c in CAPTIONS], "clean")
    assert (expected > 1).any() and (expected < -1).any(), expected  # both signs: the clamp is exercised
    for i in range(len(CAPTIONS)):  # one pair: torchmetrics clamps the score at 0
        score = clip_score(images[i : i + 1], CAPTIONS[i : i + 1], "open_clip", name, "clean", prefix,
                           pretrained=checkpoint)  # fmt: skip
        assert score == pytest.approx(max(float(expected[i]), 0.0), abs=1e-3)
    # several batches: the mean over all pairs, then clamped, then scaled (0.01: LANTERN's raw cosine)
    score = clip_score(images, CAPTIONS, "open_clip", name, "clean", prefix, scale=0.01, batch=4, pretrained=checkpoint)
    assert float(expected.mean()) > 0 and score == pytest.approx(float(expected.mean()) * 0.01, abs=1e-5)


def test_open_clip_tag_loads_from_the_local_hf_cache_with_the_tags_settings(tiny_clip, tmp_path, monkeypatch,
                                                                            no_downloads):  # fmt: skip
    name, checkpoint, model = tiny_clip
    open_clip = import_open_clip()
    tag = {"hf_hub": "sjd-test/tiny-clip/", "quick_gelu": True, "mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25)}
    monkeypatch.setitem(open_clip.pretrained._PRETRAINED, name, {"sjdtest": tag})
    with pytest.raises(FileNotFoundError, match=r"eval\.clip\.pretrained.*not in the Hugging Face cache") as e:
        resolve_open_clip_weights(name, "sjdtest", cache_dir=str(tmp_path))
    assert str(tmp_path) in str(e.value) and "hf download sjd-test/tiny-clip" in str(e.value)

    # a cache as `hf download` leaves it: refs/main names the snapshot holding the file
    repo = tmp_path / "models--sjd-test--tiny-clip"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    (snapshot / "open_clip_model.safetensors").write_bytes(open(checkpoint, "rb").read())
    loaded, transform, _ = load_open_clip(name, "sjdtest", cache_dir=str(tmp_path))
    assert isinstance(loaded.visual.transformer.resblocks[0].mlp.gelu, open_clip.transformer.QuickGELU)
    assert isinstance(model.visual.transformer.resblocks[0].mlp.gelu, torch.nn.GELU)  # the tag changed it
    assert tuple(transform.transforms[-1].mean) == (0.5, 0.5, 0.5)
    assert tuple(transform.transforms[-1].std) == (0.25, 0.25, 0.25)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_open_clip_weights_that_are_not_here_are_errors_naming_the_key(tiny_clip, tmp_path, no_downloads):
    name, _, _ = tiny_clip
    missing = tmp_path / "clip.safetensors"
    with pytest.raises(FileNotFoundError, match=r"eval\.clip\.pretrained: checkpoint file .*clip\.safetensors"):
        clip_score(np.zeros((1, 8, 8, 3), np.uint8), ["x"], "open_clip", name, pretrained=str(missing))
    # LANTERN's weights: the `openai` tag of ViT-B-32, looked up in a cache that lacks it
    with pytest.raises(FileNotFoundError, match=r"timm/vit_base_patch32_clip_224\.openai") as e:
        resolve_open_clip_weights("ViT-B/32", "openai", cache_dir=str(tmp_path))
    assert "eval.clip.pretrained" in str(e.value) and str(tmp_path) in str(e.value)
    with pytest.raises(ValueError, match=r"eval\.clip\.pretrained: 'nosuchtag' .*openai"):
        resolve_open_clip_weights("ViT-B-32", "nosuchtag")
    with pytest.raises(ValueError, match=r"eval\.clip\.pretrained: set"):
        resolve_open_clip_weights("ViT-B-32", None)  # random weights only when asked for by name:
    assert resolve_open_clip_weights("ViT-B/32", "random") == ("ViT-B-32", None, {})
    with pytest.raises(ValueError, match=r"eval\.clip\.model: open_clip has no architecture 'ViT-Z-99'"):
        resolve_open_clip_weights("ViT-Z-99", "openai")
    with pytest.raises(ValueError, match=r"eval\.clip\.backend must be one of toy, hf, open_clip"):
        clip_score(np.zeros((1, 8, 8, 3), np.uint8), ["x"], "openclip")


def test_coco_lantern_selects_open_clip_and_checks_its_weights_before_any_model(compose_cfg, tmp_path):
    cfg = compose_cfg(["eval=coco_lantern"])
    clip = cfg.eval.clip
    assert (clip.backend, clip.model, clip.pretrained, clip.scale) == ("open_clip", "ViT-B-32", "openai", 0.01)
    for f in ("inception.pth", "reference.npz"):
        (tmp_path / f).write_bytes(b"")
    missing = tmp_path / "clip" / "ViT-B-32.safetensors"
    overrides = [f"eval.fid.inception_weights={tmp_path / 'inception.pth'}",
                 f"eval.fid.reference={tmp_path / 'reference.npz'}", f"eval.clip.pretrained={missing}"]  # fmt: skip
    with pytest.raises(FileNotFoundError, match=r"eval\.clip\.pretrained: checkpoint file .*ViT-B-32\.safetensors"):
        check_eval(compose_cfg(["eval=coco_lantern", *overrides]).eval)


def test_the_torchvision_fix_is_installed_once_and_torchvision_imports():
    install_torchvision_import_fix()
    install_torchvision_import_fix()
    import sys

    assert sum(isinstance(f, _TorchvisionFinder) for f in sys.meta_path) == 1
    torchvision = import_torchvision()
    resized = torchvision.transforms.functional.resize(torch.zeros(3, 10, 20), [5, 10], antialias=True)
    assert resized.shape == (3, 5, 10)


@pytest.fixture(scope="module")
def random_inception_weights(tmp_path_factory):
    """torchvision's Inception-v3 with FID's 1008-way head: the state-dict layout of torch-fidelity's
    network (and of the real weights file), randomly initialised and saved as a torch pickle."""
    torchvision = import_torchvision()
    torch.manual_seed(0)
    net = torchvision.models.inception_v3(weights=None, aux_logits=False, num_classes=1008, init_weights=False)
    for m in net.modules():
        # He init keeps activations of order 1 through the ~100 layers; torchvision's own init
        # (truncated normal, std 0.1) grows them to ~1e10, where FID is numerically meaningless
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    path = tmp_path_factory.mktemp("inception") / "inception.pth"
    torch.save(net.state_dict(), path)
    return str(path)


@pytest.fixture
def one_thread():
    """FID's compute is MKL's eigvals of a 2048x2048 product: 5-7 s on one thread here, but ~80 s of CPU
    with the suite's 2 threads when the two cores are busy (measured), so this test runs on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_inception_fid_is_zero_for_a_set_against_itself_and_positive_against_a_noised_copy(
    random_inception_weights, one_thread
):
    metric = build_metric("inception", inception_weights=random_inception_weights, require_reference_inception=False)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (4, 48, 48, 3), dtype=np.uint8)
    noisy = np.clip(images + rng.normal(0, 60, images.shape), 0, 255).astype(np.uint8)
    add_images(metric, images, "clean", real=True)
    add_images(metric, images, "clean", real=False)
    assert metric.real_features_sum.shape == (2048,) and metric.real_features_sum.abs().sum() > 0
    assert torch.equal(metric.fake_features_sum, metric.real_features_sum)  # the extractor is deterministic
    same = float(metric.compute())
    metric.reset()  # keeps the real statistics
    add_images(metric, noisy, "clean", real=False)
    against_noisy = float(metric.compute())
    assert abs(same) < 1e-3 and against_noisy > 1.0, (same, against_noisy)


class _NotATensor:
    pass


def test_inception_weights_are_read_as_tensors_only(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"eval\.fid\.inception_weights"):
        build_metric("inception", inception_weights=str(tmp_path / "absent.pth"))
    torch.save({"fc.weight": torch.zeros(1), "payload": _NotATensor()}, tmp_path / "pickle.pth")
    with pytest.raises(ValueError, match=r"eval\.fid\.inception_weights: .*pickle\.pth holds more than tensors"):
        build_metric("inception", inception_weights=str(tmp_path / "pickle.pth"), require_reference_inception=False)


def test_inception_weights_must_be_the_reference_file_unless_the_config_says_otherwise(
    random_inception_weights, monkeypatch
):
    """FID with other Inception weights does not compare with published FIDs: the file's sha256 is checked."""
    with pytest.raises(ValueError, match=r"eval\.fid\.inception_weights: .* not the reference FID Inception file"):
        build_metric("inception", inception_weights=random_inception_weights)
    digest = hashlib.sha256(Path(random_inception_weights).read_bytes()).hexdigest()
    monkeypatch.setattr(fid_module, "REFERENCE_INCEPTION_SHA256", digest)  # as if this were the reference file
    assert build_metric("inception", inception_weights=random_inception_weights).inception is not None
