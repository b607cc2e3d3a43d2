"""Image-caption pairs -> SJD2 training shards through the model's own VQ (`sjd.sjd2.encode.make_shards`, which
scripts/make_sjd2_shards.py runs), on tiny random Lumina-mGPT (Chameleon VQGAN) and Emu3 (Emu3 VQ) checkpoints
and two random images."""

import json
from pathlib import Path

import numpy as np
import pytest
import test_adapter_chameleon as cham
import torch
from PIL import Image
from test_sjd2_hf import emu3_base, lumina_base

from sjd.sjd2.data import read_shards
from sjd.sjd2.encode import load_pixels, make_shards, read_pairs
from sjd.types import Prompt

CAPTIONS = ["a red fox", "two cats"]

pytestmark = pytest.mark.usefixtures("one_thread")


def write_pairs(folder: Path, size: int) -> Path:
    rng = np.random.default_rng(0)
    lines = []
    for i, caption in enumerate(CAPTIONS):  # non-square images: the crop matters
        Image.fromarray(rng.integers(0, 256, (size + 3 * i, size + 5, 3), dtype=np.uint8)).save(folder / f"{i}.png")
        lines.append(json.dumps({"image": f"{i}.png", "caption": caption}))
    (folder / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "pairs.jsonl"


def save_vqgan(directory: Path, vqgan) -> None:
    directory.mkdir()
    (directory / "vqgan.yaml").write_text(
        "model:\n  params:\n    embed_dim: 4\n    n_embed: 64\n    ddconfig: {double_z: false, z_channels: 8, "
        "resolution: 32, in_channels: 3, out_ch: 3, ch: 32, ch_mult: [1, 2], num_res_blocks: 1, attn_resolutions: []}\n"
    )
    torch.save({"state_dict": vqgan.state_dict()}, directory / "vqgan.ckpt")


def check_shard(shard: Path, family: str, adapter, codes: list[torch.Tensor]) -> None:
    examples = read_shards([shard], family, adapter.layout)
    assert len(examples) == len(CAPTIONS)
    free = adapter.layout.forced < 0
    for (prompt, stream), caption, grid in zip(examples, CAPTIONS, codes):
        ids, lengths = adapter.prompt_batch([Prompt("x", caption)], with_uncond=False)
        assert prompt == ids[0, ids.shape[1] - lengths[0] :].tolist()
        assert torch.tensor(stream)[free].tolist() == adapter.vocab.code_ids[grid.flatten()].tolist()


def test_lumina_pairs_encode_through_the_chameleon_vqgan(tmp_path):
    adapter, tokenizer = lumina_base()  # 2 x 2 grids: 4 x 4 codes; the tiny VQGAN's factor 2 = 8 px
    base = tmp_path / "base"
    adapter.model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    vqgan = cham.tiny_vqgan()
    save_vqgan(tmp_path / "vqgan", vqgan)
    pairs = write_pairs(tmp_path, 8)
    (shard,) = make_shards("lumina", str(base), pairs, tmp_path / "shards", str(tmp_path / "vqgan"), resolution=64)
    pixels = torch.stack([load_pixels(tmp_path / f"{i}.png", 8) for i in range(2)])
    check_shard(shard, "lumina", adapter, list(vqgan.encode(pixels)))


def test_emu3_pairs_encode_through_the_checkpoints_vq(tmp_path):
    adapter, tokenizer = emu3_base()  # 4 x 4 codes; the tiny VQ's factor 2 = 8 px
    base = tmp_path / "base"
    adapter.model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    pairs = write_pairs(tmp_path, 8)
    (shard,) = make_shards("emu3", str(base), pairs, tmp_path / "s", resolution=8)
    pixels = torch.stack([load_pixels(tmp_path / f"{i}.png", 8) for i in range(2)])
    vq = adapter.model.model.vqmodel
    with torch.no_grad():
        codes = vq.encode(pixels, torch.tensor([[8, 8]] * 2)).image_tokens
    check_shard(shard, "emu3", adapter, list(codes))


def test_pixels_are_a_centre_crop_in_minus_one_to_one(tmp_path):
    image = np.zeros((10, 20, 3), dtype=np.uint8)
    image[:, 5:15] = 255  # the centre 10 x 10 square is white
    Image.fromarray(image).save(tmp_path / "x.png")
    pixels = load_pixels(tmp_path / "x.png", 10)
    assert pixels.shape == (3, 10, 10) and torch.equal(pixels, torch.ones(3, 10, 10))


def test_a_missing_image_is_named_with_its_file_and_line_and_lumina_needs_its_vqgan(tmp_path):
    pairs = write_pairs(tmp_path, 8)
    (tmp_path / "1.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"pairs\.jsonl:2: image .*1\.png not found"):
        read_pairs(pairs)
    with pytest.raises(ValueError, match="--vqgan"):
        make_shards("lumina", str(tmp_path), pairs, tmp_path / "out")
