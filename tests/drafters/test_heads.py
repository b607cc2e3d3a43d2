"""Parallel draft heads (sjd/drafters/heads.py) and their recipe (sjd/drafters/heads_training.py,
scripts/train_heads.py), on the micro model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sjd.core.sampling import SamplingConfig, logits_to_probs
from sjd.core.seeding import make_generators
from sjd.drafters.data import make_data
from sjd.drafters.heads import (
    DraftHeads,
    HeadsConfig,
    build_heads,
    check_heads_setting,
    draw_from_heads,
    random_heads,
    save_heads,
)
from sjd.drafters.heads_training import HeadsTrainSettings, acceptance, heads_loss, step_images, train_heads
from sjd.drafters.training import target_head
from sjd.models.micro import MicroAdapter
from sjd.types import Prompt

ROOT = Path(__file__).resolve().parents[2]
SAMPLING = SamplingConfig(cfg_scale=2.0)
PROMPTS = [Prompt(f"m{i}", "ab"[i % 2]) for i in range(6)]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def micro() -> MicroAdapter:
    return MicroAdapter()


@pytest.fixture(scope="module")
def data(micro):
    from sjd.decoders.ar import ARDecoder

    def sample(prompts):
        generators = make_generators(0, [p.prompt_id for p in prompts], micro.device)
        return ARDecoder().generate(micro, prompts, SAMPLING, generators).tokens

    return make_data(micro, PROMPTS, sample, True, None, 3)


def hidden_size(adapter) -> int:
    return int(adapter.architecture()["hidden_size"])


def test_bad_offsets_and_missing_heads_are_refused_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match="distinct integers >= 1"):
        HeadsConfig(8, (1, 1))
    with pytest.raises(ValueError, match="distinct integers >= 1"):
        HeadsConfig(8, (0, 2))
    with pytest.raises(ValueError, match=r"needs draft heads: set `decoder\.heads\.weights`"):
        check_heads_setting(None, "sjd_heads")
    with pytest.raises(FileNotFoundError, match=r"decoder\.heads\.weights.*heads\.json"):
        check_heads_setting(str(tmp_path), "sjd_heads")


def test_a_heads_decoder_refuses_an_unknown_replace_rule_naming_the_key():
    from sjd.decoders.headed import SJDHeadsDecoder

    assert SJDHeadsDecoder(heads={"weights": "random"}, replace="missing").replace == "missing"
    with pytest.raises(ValueError, match=r"decoder\.replace must be one of"):
        SJDHeadsDecoder(heads={"weights": "random"}, replace="some")
    with pytest.raises(ValueError, match=r"decoder\.heads\.head must be one of"):
        SJDHeadsDecoder(heads={"weights": "random", "head": "half"})


def test_untrained_heads_repeat_the_feature_and_a_trained_residual_moves_it(micro):
    H = hidden_size(micro)
    features = torch.randn(5, H, generator=torch.Generator().manual_seed(0))
    fresh = DraftHeads(HeadsConfig(H, (1, 2, 3)))
    assert torch.equal(fresh(features), features[:, None].expand(-1, 3, -1))
    moved = random_heads(H, (1, 2, 3), seed=1)(features)
    assert moved.shape == (5, 3, H) and not torch.allclose(moved[:, 0], features)


def test_saved_heads_load_bit_for_bit_and_a_mismatch_names_the_key(micro, tmp_path):
    heads = random_heads(hidden_size(micro), (1, 2, 5), seed=3)
    save_heads(heads, tmp_path / "h", {"target": {"name": micro.name}})
    loaded = build_heads(micro, str(tmp_path / "h"))
    assert loaded.offsets == (1, 2, 5)
    for a, b in zip(heads.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b.to(a.dtype))
    config = json.loads((tmp_path / "h" / "heads.json").read_text())
    (tmp_path / "h" / "heads.json").write_text(json.dumps({**config, "hidden_size": 3}))
    with pytest.raises(ValueError, match=r"decoder\.heads\.weights.*hidden_size 3"):
        build_heads(micro, str(tmp_path / "h"))
    (tmp_path / "h" / "heads.json").write_text(json.dumps({**config, "target": {"name": "toy"}}))
    with pytest.raises(ValueError, match="trained on 'toy'"):
        build_heads(micro, str(tmp_path / "h"))


def test_a_heads_call_drafts_from_the_pipelines_q_each_row_from_its_own_generator(micro):
    """q at each offset is the shared pipeline on the heads' predicted features (what makes p), drafts lie in
    q's support, positions past the image get q = 0, and a row draws the same alone as in a batch."""
    heads = random_heads(hidden_size(micro), (1, 2, 3), seed=2)
    prompts = PROMPTS[:3]
    features = micro.prefill(prompts, with_uncond=True).features.hidden[:, -1]  # [2B, H]
    N = micro.layout.n_tokens
    predicts = torch.tensor([0, N - 3, N - 2])
    gens = make_generators(7, [p.prompt_id for p in prompts], micro.device)
    positions, drafts, q = draw_from_heads(heads, micro, SAMPLING, features, predicts, gens)
    assert positions.tolist() == [[1, 2, 3], [N - 2, N - 1, N], [N - 1, N, N + 1]]
    expected = logits_to_probs(micro.head(heads(features)), positions.clamp(max=N - 1), micro.layout, SAMPLING)
    inside = positions < N
    assert torch.allclose(q[inside], expected[inside]) and (q[~inside] == 0).all()
    assert (q[inside].gather(-1, drafts[inside][:, None]) > 0).all()
    alone = draw_from_heads(heads, micro, SAMPLING, features[[1, 4]], predicts[1:2],
                            make_generators(7, [prompts[1].prompt_id], micro.device))  # fmt: skip
    micro.prefill(prompts, with_uncond=True)  # the batch's CFG state again, for the heads' head
    assert torch.equal(alone[1][0, :2], drafts[1, :2])


@pytest.mark.parametrize("tokens", [False, True], ids=["features", "token-aware"])
def test_the_recipe_lowers_its_loss_raises_acceptance_and_reruns_bit_for_bit(micro, data, tokens):
    settings = HeadsTrainSettings(epochs=6, lr=3e-2, batch_size=2, positions=8, cfg_scale=SAMPLING.cfg_scale)
    micro.prefill(PROMPTS[:1], with_uncond=True)
    head = target_head(micro)
    embed = micro.token_embeddings() if tokens else None
    runs = []
    for _ in range(2):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            heads = DraftHeads(HeadsConfig(hidden_size(micro), (1, 2), tokens))
        before = acceptance(heads, micro, SAMPLING, data)
        first, _ = heads_loss(heads, head, step_images(data, 0, settings), 0, settings, embed=embed)
        history = train_heads(heads, head, data, settings, embed=embed)
        last, _ = heads_loss(heads, head, step_images(data, 0, settings), 0, settings, embed=embed)
        runs.append((heads, before, acceptance(heads, micro, SAMPLING, data), first.item(), last.item(), history))
    (heads, before, after, first, last, history), (again, *_) = runs
    assert last < first and len(history) == 6
    assert sum(after) > sum(before)  # on its training images: the heads learnt what the target does there
    for a, b in zip(heads.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_the_documented_training_command_writes_heads_that_a_run_decodes_with(tmp_path):
    """`python scripts/train_heads.py model=NAME` at tiny size, then `python run.py decoder=sjd_heads` with them."""
    out = tmp_path / "heads"
    train = [sys.executable, str(ROOT / "scripts" / "train_heads.py"), "model=micro", f"out={out}",
             "data.n_images=6", "measure_images=2", "train.epochs=1", f"data.cache={tmp_path / 'cache'}",
             "progress=false", f"hydra.run.dir={tmp_path / 'hydra'}"]  # fmt: skip
    done = subprocess.run(train, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((out / "heads.json").read_text())
    assert record["offsets"] == [1, 2, 3, 4] and record["target"]["name"] == "micro"
    assert record["command"].startswith("python scripts/train_heads.py model=micro")
    assert set(record["measured"]["acceptance"]) == {"1", "2", "3", "4"} and len(record["weights_sha"]) == 64
    again = subprocess.run(train, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert "nothing to do" in again.stdout
    tokens = [*train[:3], f"out={tmp_path / 'token_heads'}", *train[4:], "heads.tokens=true"]
    done = subprocess.run(tokens, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    token_record = json.loads((tmp_path / "token_heads" / "heads.json").read_text())
    assert token_record["tokens"] is True and token_record["recipe"]["heads"]["tokens"] is True
    assert "tokens" not in record and "tokens" not in record["recipe"]["heads"]  # as before token-aware heads
    decode = [sys.executable, str(ROOT / "run.py"), "model=micro", "decoder=sjd_heads", "decoder.window=4",
              f"decoder.heads.weights={out}", "prompts.n=2", "results_csv=null", "logger=csv", "save_images=false",
              f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    done = subprocess.run(decode, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sjd_heads" in done.stdout


PATTERNS = ("heads_*", "spatial_heads_*", "token_heads_*")
SHIPPED = sorted(p.name for pattern in PATTERNS for p in (ROOT / "sjd" / "assets").glob(pattern))
KEYS = {"spatial_": "spatial_heads", "token_": "token_heads"}  # right and below heads (decoder=ssd); token-aware


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_heads_directory_is_its_models_and_matches_its_record(name):
    """A model config that names shipped heads names a directory whose weights hash to its record, trained on that
    model by the recorded command, with acceptance measured on held-out images."""
    from omegaconf import OmegaConf

    from sjd.drafters.recipe import file_sha256

    directory = ROOT / "sjd" / "assets" / name
    record = json.loads((directory / "heads.json").read_text())
    model = record["target"]["name"]
    key = next((k for prefix, k in KEYS.items() if name.startswith(prefix)), "heads")
    assert OmegaConf.load(ROOT / "conf" / "model" / f"{model}.yaml")[key] == f"sjd/assets/{name}"
    assert file_sha256(directory / "heads.safetensors") == record["weights_sha"]
    assert record["command"].startswith(f"python scripts/train_heads.py model={model} ")
    assert f"out=sjd/assets/{name}" in record["overrides"]
    assert record.get("tokens", False) is name.startswith("token_")
    measured = record["measured"]["acceptance"]
    assert set(measured) == {str(d) for d in record["offsets"]} and all(0 < a <= 1 for a in measured.values())


def test_token_aware_heads_start_as_the_feature_read_the_token_and_refuse_to_chain(micro):
    """Untrained (W_j = 0) token-aware heads repeat the feature, as feature-only heads do; trained ones move with
    the token they are given; without one they refuse, and SSD's chained prediction (`one`) has none to give."""
    H = hidden_size(micro)
    features = torch.randn(5, H, generator=torch.Generator().manual_seed(0))
    embed = micro.token_embeddings()
    fresh = DraftHeads(HeadsConfig(H, (1, 2), tokens=True))
    assert torch.equal(fresh(features, embed[[5, 6, 7, 5, 6]]), features[:, None].expand(-1, 2, -1))
    heads = random_heads(H, (1, 2), seed=1, tokens=True)
    one, other = heads(features, embed[[5] * 5]), heads(features, embed[[6] * 5])
    assert not torch.allclose(one, other)
    with pytest.raises(ValueError, match="need the embeddings of the tokens"):
        heads(features)
    with pytest.raises(ValueError, match="no token to give them"):
        heads.one(features, 1)


def test_token_aware_heads_save_and_load_with_their_flag_and_ssd_refuses_them_naming_the_key(micro, tmp_path):
    from sjd.decoders.ssd import SSDDecoder

    heads = random_heads(hidden_size(micro), (1, 2), seed=3, tokens=True)
    save_heads(heads, tmp_path / "h", {"target": {"name": micro.name}})
    assert json.loads((tmp_path / "h" / "heads.json").read_text())["tokens"] is True
    loaded = build_heads(micro, str(tmp_path / "h"))
    assert loaded.config.tokens and set(loaded.state_dict()) == set(heads.state_dict())
    assert "tokens" not in random_heads(4, (1,), seed=0).config.to_dict()  # feature-only heads.json as before
    with pytest.raises(ValueError, match=r"token-aware heads: use heads trained without heads\.tokens"):
        SSDDecoder(heads={"weights": "random_tokens"}, context=1).check(micro)


@pytest.mark.parametrize("decoder", ["sjd_heads", "csjd_head_siblings"])
def test_token_aware_heads_read_the_committed_token_at_the_position_their_feature_predicts(micro, decoder, monkeypatch):
    """Every heads call gives token-aware heads, for each row it drafts inside the image for, the token the decode
    finally holds at the position the feature predicts: a committed token (SJD's heads draw after the commit, from
    the state; SJD-PAC's commit draws them before writing, from what it is about to write). A finished row's draws
    (every position past the image, q = 0) are never used."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    import sjd.decoders.headed as headed
    from sjd.harness.decoder_configs import decoder_config

    calls = []

    def spy(heads, adapter, sampling, features, predicts, generators, code_head=False, tokens=None):
        calls.append((predicts.clone(), tokens.clone()))
        return draw_from_heads(heads, adapter, sampling, features, predicts, generators, code_head, tokens)

    monkeypatch.setattr(headed, "draw_from_heads", spy)
    cfg = OmegaConf.merge(decoder_config(decoder), {"window": 4, "heads": {"weights": "random_tokens"}})
    prompts = PROMPTS[:4]
    generators = make_generators(0, [p.prompt_id for p in prompts], micro.device)
    out = instantiate(cfg).generate(micro, prompts, SAMPLING, generators)
    assert len(calls) > 2
    for predicts, tokens in calls:
        inside = (predicts >= 0) & (predicts < out.tokens.shape[1] - 1)
        rows = torch.arange(len(predicts))[inside]
        assert torch.equal(tokens[inside], out.tokens[rows, predicts[inside]])
