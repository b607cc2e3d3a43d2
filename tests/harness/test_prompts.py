"""Prompt sets: documented counts and hashes, COCO longest-caption selection, bad files."""

import hashlib
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sjd.harness.prompts import PromptFileError, load_prompt_file, load_prompt_set

ROOT = Path(__file__).resolve().parents[2]
COUNTS = {"coco5k": 5000, "coco30k": 30000, "parti": 1632, "geneval": 553, "drawbench": 200, "sjd_demo": 10, "toy": 64}
# sha256 of the 5,000 raw longest captions joined by newlines, in image-id order, computed from
# the shared data's independently derived coco2017_val_longest5k.jsonl.
COCO5K_CAPTIONS_SHA256 = "20dfde55a0f19f1fb77773712d47fcd1eaf83170bd292fcec6553ddec42a48ec"


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_prompt_sets_have_their_documented_counts_and_hashes(name):
    cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "prompts" / f"{name}.yaml"))
    cfg["n"] = None
    ps = load_prompt_set(**cfg)  # refuses a file whose sha256 differs from the config's
    assert ps.n_total == len(ps.prompts) == COUNTS[name]
    assert ps.sha256 == cfg["sha256"]
    assert all(p.text == " ".join(p.text.split()) and p.text for p in ps.prompts)


def test_coco5k_is_the_longest_caption_per_image_in_image_id_order():
    from sjd.harness.prompts import _coco_longest

    rows = _coco_longest(ROOT / "sjd" / "assets" / "prompts" / "coco2017_captions_val2017.json")
    raw = "\n".join(caption for _, _, caption in rows)
    assert hashlib.sha256(raw.encode()).hexdigest() == COCO5K_CAPTIONS_SHA256
    assert [pid for _, pid, _ in rows[:3]] == ["139", "285", "632"]


def test_coco30k_keeps_commas_and_quotes_inside_captions():
    ps = load_prompt_set(**OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "prompts" / "coco30k.yaml")))
    assert any("," in p.text for p in ps.prompts) and any('"' in p.text for p in ps.prompts)


def test_selection_first_n_and_seeded_subset():
    path = "sjd/assets/prompts/parti_prompts.tsv"
    first = load_prompt_set("parti", path, n=5)
    assert [p.prompt_id for p in first.prompts] == ["0", "1", "2", "3", "4"] and first.selection == "first 5 of 1632"
    a, b = load_prompt_set("parti", path, n=20, subset_seed=3), load_prompt_set("parti", path, n=20, subset_seed=3)
    c = load_prompt_set("parti", path, n=20, subset_seed=4)
    assert a.prompts == b.prompts != c.prompts and a.selection == "20 of 1632, seed 3"


def test_a_changed_file_is_refused(tmp_path):
    f = tmp_path / "p.tsv"
    f.write_text("Prompt\na cat\n")
    with pytest.raises(PromptFileError, match="differs from prompts.sha256"):
        load_prompt_set("x", str(f), sha256="0" * 64)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.jsonl", '{"caption": "a cat"}\n{"caption": "a dog"\n', r"bad\.jsonl:2: bad JSON"),
        ("nocol.tsv", "Text2\tOther\na cat\tx\n", r"nocol\.tsv:1: no caption column"),
        ("empty.tsv", "Prompt\na cat\n   \n", r"empty\.tsv:3: empty caption"),
        ("missing.jsonl", '{"caption": "a cat"}\n{"text2": "a dog"}\n', r"missing\.jsonl:2: no caption field"),
        ("dup.tsv", "id\tPrompt\nx\ta cat\nx\ta dog\n", r"dup\.tsv:3: duplicate prompt id 'x'"),
    ],
)
def test_malformed_prompt_files_name_file_and_line(tmp_path, name, content, message):
    f = tmp_path / name
    f.write_text(content)
    with pytest.raises(PromptFileError, match=message):
        load_prompt_file(f)
