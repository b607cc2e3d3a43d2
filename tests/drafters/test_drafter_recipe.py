"""Our drafter recipe (scripts/train_drafter.py, sjd/drafters/{data,training,recipe,quality}.py): its pairing,
masks, loss and head are EAGLE's; a killed run resumes to the same weights bit for bit; a tiny run on the micro
model trains, saves, loads through `decoder.drafter.weights` and decodes; and every shipped drafter passes
`--check-recipe`, which says what it checked, and fails, saying where, when its files or its recipe change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import sjd.drafters.training as training
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.eagle import EagleDecoder
from sjd.drafters.checkpoint import load_drafter, resolve
from sjd.drafters.data import DrafterData, Row, make_data
from sjd.drafters.training import (
    TrainSettings,
    batch_gradients,
    batch_rows,
    collate,
    drafter_forward,
    init_drafter,
    lr_factor,
    target_head,
    train,
    trainable,
)
from sjd.types import Prompt

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.name for p in (ROOT / "sjd" / "assets").glob("drafter_*"))
MODELS = {"drafter_toy": "toy", "drafter_standin_lumina_512_cal": "standin_lumina_512_cal",
          "drafter_standin_lumina_768_cal": "standin_lumina_768_cal",
          "drafter_standin_lumina_512_cal_calibrated": "standin_lumina_512_cal"}  # fmt: skip
# the model config key naming each shipped drafter: `drafter` (what decoder=eagle & co. take), or another a study
# overlay names (conf/experiment/drafters_calibrated.yaml)
MODEL_KEY = {"drafter_standin_lumina_512_cal_calibrated": "drafter_calibrated"}


@pytest.fixture(scope="module")
def script():
    """What scripts/train_drafter.py runs (the script is its command line only): the training and its checks."""
    from types import SimpleNamespace

    from sjd.training import drafter, drafter_checks

    return SimpleNamespace(**(vars(drafter) | vars(drafter_checks)))


@pytest.fixture(scope="module")
def micro():
    from sjd.models.micro import MicroAdapter

    return MicroAdapter()


def micro_data(micro, n: int = 6) -> DrafterData:
    from sjd.decoders.ar import ARDecoder

    sampling = SamplingConfig(2.0)
    prompts = [Prompt(f"m{k}", "a" if k % 2 else "b") for k in range(n)]

    def sample(chunk):
        gens = make_generators(0, [p.prompt_id for p in chunk], micro.device)
        return ARDecoder().generate(micro, chunk, sampling, gens).tokens

    return make_data(micro, prompts, sample, True, None, 4)


def test_rows_pair_each_feature_with_the_next_token_and_learn_only_generated_features(micro):
    """EAGLE's pairing (f_j, id_{j+1}) -> f_{j+1}; the learnt targets are exactly the generated positions'
    features; the input noise is uniform within +-noise_std * 256 / L; padding is zero and never learnt."""
    data = micro_data(micro, 2)
    cond, uncond = data.images[0]
    assert cond.prompt_len == 2 and uncond.prompt_len == 2  # micro: [BOS, word] and [BOS, NULL]
    n = micro.layout.n_tokens
    assert len(cond.ids) == cond.prompt_len + n and len(cond.features) == len(cond.ids) - 1
    settings = TrainSettings(noise_std=0.2)
    rows = [cond, Row(cond.ids[:-1], cond.features[:-1], cond.prompt_len)]  # a shorter row pads
    batch = collate(rows, step=0, settings=settings, device=torch.device("cpu"))
    L = len(cond.features) - 1
    assert torch.equal(batch.tokens[0], cond.ids[1 : L + 1])
    assert torch.equal(batch.targets[0], cond.features[1 : L + 1])
    noise = batch.features[0] - cond.features[:L]
    assert 0 < float(noise.abs().max()) <= 0.5 * 0.2 * 512 / L
    generated = torch.arange(L) + 1 >= cond.prompt_len  # the target feature sits at a generated position
    assert torch.equal(batch.learn[0], generated) and int(batch.learn[0].sum()) == n - 1
    assert not bool(batch.learn[1, -1]) and float(batch.features[1, -1].abs().max()) == 0


def test_rows_are_conditional_with_probability_0_9_and_batches_are_a_function_of_seed_and_step(micro):
    data = micro_data(micro, 4)
    settings = TrainSettings(batch_size=4, p_uncond=0.1)
    picks = [row is images[1] for step in range(200) for row, images in
             zip(batch_rows(data, step, settings), [data.images[i] for i in _order(data, step, settings)])]  # fmt: skip
    assert 0.05 < sum(picks) / len(picks) < 0.16
    again = [batch_rows(data, 7, settings), batch_rows(data, 7, settings)]
    assert [id(r) for r in again[0]] == [id(r) for r in again[1]]


def _order(data, step, settings):
    import numpy as np

    per_epoch = training.steps_per_epoch(len(data), settings)
    epoch, within = divmod(step, per_epoch)
    order = np.random.default_rng(training.step_seed(settings, epoch, 0)).permutation(len(data))
    return order[within * settings.batch_size : (within + 1) * settings.batch_size]


def test_the_loss_is_eagles_and_its_gradients_reach_only_the_drafter(micro, monkeypatch):
    """SmoothL1 over H + 0.1 * soft cross-entropy against the target head's own softmax, averaged over the
    learnt positions, computed in pieces (CE_CHUNK) and by autograd in one go: the same loss and gradients; the
    target's head weights get no gradient and the frozen embedding none either."""
    data = micro_data(micro, 2)
    net = init_drafter(micro, seed=3)
    head = target_head(micro)  # micro's head is affine: one matrix product read off the adapter's `head`
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(head(x), _direct_head(micro, x), atol=1e-5)
    settings = TrainSettings(noise_std=0.0)
    batch = collate([data.images[0][0], data.images[1][1]], 0, settings, torch.device("cpu"))
    monkeypatch.setattr(training, "CE_CHUNK", 3)
    grads, log = batch_gradients(net, head, batch, settings)

    pred = drafter_forward(net, batch)[batch.learn]
    target = batch.targets[batch.learn]
    regression = F.smooth_l1_loss(pred, target, reduction="none").mean(-1).mean()
    soft = torch.softmax(_direct_head(micro, target), -1)
    ce = -(soft * torch.log_softmax(_direct_head(micro, pred), -1)).sum(-1).mean()
    loss = regression + 0.1 * ce
    expected = torch.autograd.grad(loss, trainable(net))
    assert log["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    for ours, theirs in zip(grads, expected):
        assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-7)
    assert micro.model.lm_head.weight.grad is None
    assert not net.embed_tokens.weight.requires_grad


def _direct_head(micro, hidden):
    return micro.model.lm_head(hidden)


def test_the_learning_rate_warms_up_over_3_percent_of_an_epoch_then_decays_linearly_to_zero():
    settings = TrainSettings(epochs=2, lr=1.0, warmup_frac=0.03)
    per_epoch = 100  # warmup: 3 steps
    factors = [lr_factor(s, per_epoch, settings) for s in range(200)]
    assert factors[:4] == pytest.approx([1 / 3, 2 / 3, 1.0, 197 / 197])
    assert factors[100] == pytest.approx(100 / 197) and factors[-1] == pytest.approx(1 / 197)
    assert all(a >= b for a, b in zip(factors[2:], factors[3:]))


def test_a_killed_run_resumes_to_the_same_weights_bit_for_bit(micro, tmp_path):
    """Train 12 steps straight; train again, killed after step 7 (its state written at step 6), rerun with the
    same arguments: the resumed run ends with every tensor equal to the uninterrupted one's."""
    data = micro_data(micro, 6)
    settings = TrainSettings(epochs=6, batch_size=3)  # 2 steps an epoch, 12 in all
    head = target_head(micro)
    straight = init_drafter(micro, 0)
    train(straight, head, data, settings)

    class Killed(Exception):
        pass

    def kill_after_7(step, log):
        if step == 7:
            raise Killed

    state = tmp_path / "state.pt"
    first = init_drafter(micro, 0)
    with pytest.raises(Killed):
        train(first, head, data, settings, state_path=state, checkpoint_every=3, meta={"recipe": "x"},
              on_step=kill_after_7)  # fmt: skip
    assert torch.load(state, weights_only=True)["step"] == 6
    resumed = init_drafter(micro, 0)
    history = train(resumed, head, data, settings, state_path=state, checkpoint_every=3, meta={"recipe": "x"})
    assert history[-1]["step"] == 12
    ours, theirs = resumed.state_dict(), straight.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    with pytest.raises(ValueError, match=r"state\.pt: a training state of another run: recipe 'x' \(this run's: 'y'\)"):
        train(init_drafter(micro, 0), head, data, settings, state_path=state, meta={"recipe": "y"})


def test_a_tiny_recipe_run_trains_saves_loads_and_decodes(script, micro, tmp_path, compose_cfg):
    """The whole recipe on the micro model: captions, AR samples, features, training, the probe, the record;
    the directory loads through `decoder.drafter.weights` (its embedding the target's) and EagleDecoder decodes
    with it; --check-retrain reproduces it bit for bit; --check-recipe passes, then fails where a file or the
    record was changed."""
    out = tmp_path / "drafter"
    overrides = [f"out={out}", "model=micro", "data.n_images=6", "data.batch_size=3", "train.epochs=2",
                 f"data.cache={tmp_path / 'cache'}", "progress=false", "measure_images=2"]  # fmt: skip
    record = script.build(script.compose(overrides), overrides)
    assert record["command"] == "python scripts/train_drafter.py " + " ".join(overrides)
    assert record["data"]["space"] == "micro" and record["training"]["steps"] == 4
    assert set(load_file(out / "model.safetensors")) == set(init_drafter(micro, 0).state_dict()) - {
        "embed_tokens.weight"}  # fmt: skip
    assert script.build(script.compose(overrides), overrides)["weights_sha"] == record["weights_sha"]  # up to date

    net = load_drafter(micro, str(out))
    assert torch.equal(net.embed_tokens.weight, micro.token_embeddings())
    decoder = EagleDecoder(drafter={"weights": str(out)}, depth=2, top_k=2, total_tokens=4)
    prompts = [Prompt("p0", "a"), Prompt("p1", "b")]
    result = decoder.generate(micro, prompts, SamplingConfig(2.0), make_generators(0, ["p0", "p1"], micro.device))
    free = micro.layout.forced < 0
    assert torch.equal(result.tokens[:, ~free], micro.layout.forced[~free].expand(2, -1))
    assert decoder.config()["drafter"]["record"]["recipe_sha"] == record["recipe_sha"]

    findings, not_checked = script.check_recipe(out)
    assert [(f.what, f.ok) for f in findings] == [(w, True) for w in ("weights", "arguments", "command", "target",
                                                                      "probe")]  # fmt: skip
    assert any("full retrain" in item for item in not_checked)
    assert [(f.what, f.ok) for f in script.check_retrain(out)] == [("data", True), ("weights", True)]

    changed = {**record, "recipe": json.loads(json.dumps(record["recipe"]))}
    changed["recipe"]["train"]["lr"] *= 1.5  # another recipe claimed, its hash made to match
    changed["recipe_sha"] = script.recipe_sha(changed["recipe"])
    (out / "drafter.json").write_text(json.dumps(changed))
    weights = load_file(out / "model.safetensors")
    weights["fc.bias"] = weights["fc.bias"] + 1
    from safetensors.torch import save_file

    save_file(weights, str(out / "model.safetensors"))
    failed = {f.what: f.statement for f in script.check_recipe(out)[0] if not f.ok}
    assert set(failed) == {"weights", "command", "probe"}, failed
    assert "train.lr recorded 0.0015, today 0.001" in failed["command"]
    assert "differs from the recorded one by at most" in failed["probe"]

    samples = load_file(out / script.PROBE_SAMPLES_FILE)["samples"]
    samples[0, -1] += 1  # a draw other than the recorded one: its hash no longer matches
    save_file({"samples": samples}, str(out / script.PROBE_SAMPLES_FILE))
    failed = {f.what: f.statement for f in script.check_recipe(out)[0] if not f.ok}
    assert "the record's probe.samples_sha is" in failed["probe"]
    (out / script.PROBE_SAMPLES_FILE).unlink()
    failed = {f.what: f.statement for f in script.check_recipe(out)[0] if not f.ok}
    assert "--record-probe-samples" in failed["probe"]


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.slow  # a retrain, a rebuild or a large fixture: make test runs it, the edit loops do not
def test_every_shipped_drafter_passes_its_recipe_check(script, name):
    """`--check-recipe` on the shipped drafter: its weights file hashes to its record, its arguments to its
    recipe_sha, its command composes them today, its target is the recorded one, and the recipe's first steps
    reproduce its probe fingerprint."""
    findings, _ = script.check_recipe(ROOT / "sjd" / "assets" / name)
    assert all(f.ok for f in findings) and len(findings) == 5, "\n".join(f.line() for f in findings)


@pytest.mark.slow  # a retrain, a rebuild or a large fixture: make test runs it, the edit loops do not
@pytest.mark.parametrize("name", ["drafter_toy", "drafter_standin_lumina_768_cal"])
def test_the_recipe_check_survives_another_cpu_kernel_set_and_thread_count(name):
    """As a user runs it, on one thread under PyTorch's and MKL's baseline kernels (ATEN_CPU_CAPABILITY=default,
    MKL_ENABLE_INSTRUCTIONS=SSE4_2), which round differently from the vector kernels and the two threads the
    record was made with, as another machine's CPU does; it prints each statement. The 768 px stand-in's long
    images are where a resampled probe parted from the record (one draw in a few thousand crosses a cut): the
    probe's kept samples are what makes it pass."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    cmd = [sys.executable, str(ROOT / "scripts" / "train_drafter.py"), "--check-recipe", f"sjd/assets/{name}",
           "--threads", "1"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for what in ("weights", "arguments", "command", "target", "probe"):
        assert f"ok      {what}: " in proc.stdout
    assert "not checked: that a full retrain gives these weights" in proc.stdout


@pytest.mark.parametrize("name", SHIPPED)
def test_each_model_config_names_its_shipped_drafter_and_it_fits(compose_cfg, name):
    cfg = compose_cfg([f"model={MODELS[name]}", "decoder=eagle"])
    key = MODEL_KEY.get(name, "drafter")
    weights = cfg.decoder.drafter.weights if key == "drafter" else cfg.model[key]
    assert weights == f"sjd/assets/{name}"
    record = json.loads((resolve(weights) / "drafter.json").read_text())
    assert record["recipe"]["model"]["name"] == MODELS[name]
    assert record["measured"]["top10"]["accept"] > record["measured"]["top10"]["untrained"]
    assert (resolve(weights) / "model.safetensors").stat().st_size < 2_000_000


def test_training_captions_never_are_evaluation_prompts(script, toy):
    """The toy trains on scenes outside prompts/toy.tsv; the stand-ins on themes outside the first 32 of
    prompts/standin.tsv (which lists the whole grammar); no id is a prompt file's."""
    from sjd.harness.prompts import load_prompt_file

    args = {"data": {"captions": "auto", "held_out": "auto", "held_out_n": None, "n_images": 300, "seed": 0}}
    prompts, info = script.training_captions(args, toy)
    toy_file = {p.text for p in load_prompt_file(ROOT / "sjd" / "assets" / "prompts" / "toy.tsv")}
    assert not {p.text for p in prompts} & toy_file and info["overlap_held_out"] == 0
    assert all(p.prompt_id.startswith("drafter-train-") for p in prompts)

    class Standin:  # the caption space is chosen by adapter type; a stand-in's check_prompts accepts themes
        name = "standin"

        def check_prompts(self, prompts):
            pass

    args["data"]["captions"] = "standin_themes"
    themes, info = script.training_captions(args, Standin())
    first_32 = {p.text for p in load_prompt_file(ROOT / "sjd" / "assets" / "prompts" / "standin.tsv")[:32]}
    assert not {p.text for p in themes} & first_32 and info["distinct"] == 168 - 32


def test_a_head_that_is_not_affine_trains_through_the_adapters_own_head(micro):
    """Janus's head is an MLP: `target_head` then runs the adapter's `head` without its no_grad wrapper, and the
    gradient is the one of the head's own function."""
    from sjd.models.micro import MicroAdapter

    class CurvedHead(MicroAdapter):
        @torch.no_grad()
        def head(self, hidden):
            return self._split(torch.tanh(self.model.lm_head(hidden)))

    curved = CurvedHead()
    curved.prefill([Prompt("p", "a")], True)
    assert training.affine_head(curved, 32) is None
    head = target_head(curved)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(2), requires_grad=True)
    (ours,) = torch.autograd.grad(head(x).pow(2).sum(), x)
    (theirs,) = torch.autograd.grad(torch.tanh(curved.model.lm_head(x)).pow(2).sum(), x)
    assert torch.allclose(ours, theirs, atol=1e-6)
