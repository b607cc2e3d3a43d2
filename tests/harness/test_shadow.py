"""Shadow timing (sjd/models/shadow.py, sjd/harness/shadow.py): the samples are the model's whatever the shadow,
the shadow receives every call with the same shapes, the clock leaves the model's calls out of the latency, and bad
settings fail at start-up naming their key."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_run import run_py

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.drafters.heads import DraftHeads
from sjd.drafters.net import DrafterNet
from sjd.drafters.shadow import ShadowedDrafterNet, ShadowedDraftHeads
from sjd.harness.config_check import ConfigError, check_run_config
from sjd.harness.shadow import ShadowSettings, build_architecture, check_same_shadow, with_shadow
from sjd.models.base import ModelAdapter
from sjd.models.loading import networks_sha
from sjd.models.shadow import ShadowedAdapter, distinct_forced, follow_layout, token_table
from sjd.types import ImageLayout, Logits, Prompt

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [Prompt("a", "large red circle center"), Prompt("b", "small blue square top left on green")]
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=200)
TINY_LLAMAGEN = ShadowSettings(name="llamagen", layers=1, tiny=True)
CALLS = ("prefill", "forward", "forward_at", "keep_slots", "head", "code_head")


def tiny_shadow(settings: ShadowSettings = TINY_LLAMAGEN) -> ModelAdapter:
    return build_architecture(settings, settings.tiny, torch.device("cpu"), torch.float32).adapter


def spy_on(adapter: ModelAdapter, monkeypatch) -> dict[str, list[tuple]]:
    """Record the arguments of every model call made on `adapter` from outside (a `code_head` that calls `head`
    is one call), restored after the test."""
    seen: dict[str, list[tuple]] = {name: [] for name in CALLS}
    inside = [0]
    for name in CALLS:
        method = getattr(adapter, name)

        def spy(*args, _method=method, _name=name):
            if not inside[0]:
                seen[_name].append(args)
            inside[0] += 1
            try:
                return _method(*args)
            finally:
                inside[0] -= 1

        monkeypatch.setattr(adapter, name, spy)
    return seen


def spy_on_networks(monkeypatch) -> dict[str, list[str]]:
    """Record, for each call of a drafter layer or of draft heads (`forward`, `one`), whose it was: the decoder's
    own network (`own`, a copy beside a shadow) or its twin at the shadow's width (`twin`)."""
    seen: dict[str, list[str]] = {"drafter": [], "heads": []}
    for cls, method, kind, own in (
        (DrafterNet, "forward", "drafter", ShadowedDrafterNet),
        (DraftHeads, "forward", "heads", ShadowedDraftHeads),
        (DraftHeads, "one", "heads", ShadowedDraftHeads),
    ):
        original = getattr(cls, method)

        def spy(self, *args, _original=original, _kind=kind, _own=own):
            seen[_kind].append("own" if isinstance(self, _own) else "twin")
            return _original(self, *args)

        monkeypatch.setattr(cls, method, spy)
    return seen


@pytest.mark.parametrize("decoder", ["sjd", "sjd_pac", "eagle", "sjd_heads", "ssd"])
def test_tokens_are_the_models_with_a_shadow_and_the_shadow_gets_every_call(decoder, toy, monkeypatch):
    """SJD (windows), SJD-PAC (sibling branches), EAGLE (a drafter's tree through forward_at and keep_slots), heads
    (SJD with heads; SSD's chained `one`): the same tokens with a one-layer tiny LlamaGen as the shadow as without;
    the shadow sees each call with the model's rows, positions and masks, its tokens mapped by the table; and every
    call of the decoder's drafter or heads is also run by a twin at the shadow's width."""
    from decoder_on_model import fitted, resolved_decoder

    alone = fitted(resolved_decoder(decoder, "toy"), toy).generate(
        toy, PROMPTS, SAMPLED, make_generators(0, ["a", "b"], toy.device)
    )
    shadow = tiny_shadow()
    shadowed = ShadowedAdapter(toy, shadow, {"shadow": "llamagen"})
    run = fitted(resolved_decoder(decoder, "toy"), shadowed)
    model_calls, shadow_calls = spy_on(toy, monkeypatch), spy_on(shadow, monkeypatch)
    networks = spy_on_networks(monkeypatch)
    result = run.generate(shadowed, PROMPTS, SAMPLED, make_generators(0, ["a", "b"], toy.device))

    assert torch.equal(result.tokens, alone.tokens) and result.n_forward == alone.n_forward
    assert result.set_aside_s > 0  # the model's calls were timed apart
    assert networks_sha(run.networks(shadowed)) == networks_sha(run.networks(toy))  # the drafter's own weights
    for name in CALLS:
        assert len(shadow_calls[name]) == len(model_calls[name]), name
    for (tokens, start), (ids, shadow_start) in zip(model_calls["forward"], shadow_calls["forward"]):
        assert shadow_start == start and torch.equal(ids, shadowed.ids[tokens])
    for ours, theirs in zip(model_calls["forward_at"], shadow_calls["forward_at"]):
        assert torch.equal(theirs[0], shadowed.ids[ours[0]]) and all(a is b for a, b in zip(ours[1:], theirs[1:]))
    for ours, theirs in zip(model_calls["keep_slots"], shadow_calls["keep_slots"]):
        assert ours[0] is theirs[0]
    width = shadow.architecture()["hidden_size"]
    heads = model_calls["head"] + model_calls["code_head"]
    for ours, theirs in zip(heads, shadow_calls["head"] + shadow_calls["code_head"]):
        assert theirs[0].shape == (*ours[0].shape[:-1], width)
    for kind, calls in networks.items():
        assert calls.count("own") == calls.count("twin"), kind
    uses = {"eagle": "drafter", "sjd_heads": "heads", "ssd": "heads"}.get(decoder)
    assert bool(networks["drafter"]) == (uses == "drafter") and bool(networks["heads"]) == (uses == "heads")
    if decoder == "eagle":  # the calls only a tree decoder with a drafter makes
        assert model_calls["forward_at"] and model_calls["keep_slots"] and heads


def test_codes_map_by_index_and_structure_tokens_to_the_shadows(toy):
    lumina = tiny_shadow(ShadowSettings(name="lumina", layers=1, tiny=True))
    table = token_table(toy.layout, lumina.layout)
    codes, theirs = toy.layout.free_token_ids, lumina.layout.free_token_ids
    assert torch.equal(table[codes], theirs[torch.arange(len(codes)) % len(theirs)])
    ours_forced = distinct_forced(toy.layout)  # begin-of-image, end-of-line, end-of-image
    assert table[ours_forced].tolist() == distinct_forced(lumina.layout)[: len(ours_forced)]
    followed = follow_layout(lumina.layout, toy.layout, table)
    assert followed.n_tokens == toy.layout.n_tokens and followed.vocab_size == lumina.layout.vocab_size
    forced = toy.layout.forced >= 0
    assert torch.equal(followed.forced >= 0, forced)
    assert torch.equal(followed.forced[forced], table[toy.layout.forced[forced]])

    llamagen = tiny_shadow()  # no structure tokens: the model's become codes
    assert bool(llamagen.layout.free_tokens[token_table(toy.layout, llamagen.layout)].all())


# -- the clock: the model's calls leave every latency column ----------------------------------------------------
class FakeTime:
    """perf_counter that moves only when a fake model works."""

    now = 0.0

    @classmethod
    def work(cls, seconds: float) -> None:
        cls.now += seconds


LAYOUT = ImageLayout(
    n_tokens=5, height=1, width=3, row_stride=3, first_code=1, forced=torch.tensor([1, -1, -1, -1, 2]),
    free_tokens=torch.tensor([False, False, False, True, True, True]), vocab_size=6,
)  # fmt: skip


class FakeModel(ModelAdapter):
    """Uniform logits; each call costs `cost` fake seconds."""

    name, device, layout = "fake", torch.device("cpu"), LAYOUT

    def __init__(self, cost: float) -> None:
        self.cost = cost

    def prefill(self, prompts, with_uncond):
        FakeTime.work(self.cost)
        return Logits(torch.zeros(len(prompts), 1, 6), torch.zeros(len(prompts), 1, 6) if with_uncond else None)

    def forward(self, tokens, start):
        FakeTime.work(self.cost)
        B, W = tokens.shape
        return Logits(torch.zeros(B, W, 6), torch.zeros(B, W, 6))

    def decode_images(self, tokens):
        raise NotImplementedError


def test_the_models_calls_leave_the_latency_model_time_and_stages(monkeypatch):
    """With a model call costing 3 s and its shadow's 5 s (fake time, nothing else costs any): prefill_s and
    decode_s hold the shadow's calls, model_s the shadow's alone, the forward stage the shadow's decode calls, and
    the model's 3 s a call are reported apart."""
    monkeypatch.setattr(time, "perf_counter", lambda: FakeTime.now)
    FakeTime.now = 0.0
    shadowed = ShadowedAdapter(FakeModel(3.0), FakeModel(5.0))
    result = ARDecoder().generate(shadowed, PROMPTS[:1], SAMPLED, make_generators(0, ["a"], "cpu"))
    calls = LAYOUT.n_tokens  # the prefill and one forward a position after the first
    assert result.prefill_s == 5.0 and result.decode_s == 5.0 * (calls - 1)
    assert result.model_s == 5.0 * calls and result.set_aside_s == 3.0 * calls
    assert result.stage_s["forward"] == 5.0 * (calls - 1) and result.stage_s["other"] == 0.0


class FakeEvent:
    """torch.cuda.Event on a fake GPU clock: each event recorded 1.5 ms after the one before."""

    clock = 0.0
    waits = 0

    def __init__(self, enable_timing: bool = False) -> None:
        self.at = 0.0

    def record(self) -> None:
        FakeEvent.clock += 1.5
        self.at = FakeEvent.clock

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.at - self.at

    def synchronize(self) -> None:
        FakeEvent.waits += 1


def test_a_paused_span_goes_to_no_stage_on_a_gpu_and_the_stage_keeps_the_rest(monkeypatch):
    from sjd.decoders.stages import StageClock

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    stages = StageClock(torch.device("cuda"))
    stages.begin()
    stages.lap("draft")
    stages.pause()
    stages.resume()
    stages.lap("forward")
    split = stages.split(decode_s=10.0)
    assert split["draft"] == pytest.approx(1.5e-3) and split["forward"] == pytest.approx(3e-3)  # not the paused 1.5


def test_on_a_gpu_a_set_aside_span_is_timed_by_events_nothing_waits_for_until_it_is_read(monkeypatch):
    """A model call holding a set-aside span: the call's events at 1.5 and 6 ms, the span's at 3 and 4.5 ms, so the
    model time is 3 ms of the call's 4.5 and the 1.5 ms set aside fell in the prefill (the stages had not begun)."""
    from sjd.decoders.base import ForwardClock

    class OnGPU:
        name, device = "fake", torch.device("cuda")

        def timed_by(self, clock) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.clock, FakeEvent.waits = 0.0, 0
    clock = ForwardClock(OnGPU())
    clock.defer_finite_check = True

    def call() -> Logits:
        with clock.set_aside():
            pass
        return Logits(torch.zeros(1, 1, 3), None)

    clock._timed(call)
    assert FakeEvent.waits == 0
    assert clock.aside_seconds() == {"prefill": pytest.approx(1.5e-3), "decode": 0.0, "in_calls": pytest.approx(1.5e-3)}
    assert clock.model_s == pytest.approx(3e-3)


# -- start-up checks ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, key",
    [
        (["shadow.name=gpt2"], "shadow.name='gpt2'"),
        (["shadow=llamagen", "shadow.layers=0"], "shadow.layers=0"),
        (["shadow=llamagen", "shadow.dtype=fp8"], "shadow.dtype='fp8'"),
        (["shadow.layers=1"], "shadow.layers=1"),  # settings of no shadow
    ],
)
def test_bad_shadow_settings_fail_at_start_up_naming_the_key(overrides, key, compose_cfg):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_run_config(compose_cfg(overrides))


def test_a_shadow_whose_stream_cannot_hold_the_models_fails_naming_the_key(compose_cfg, toy):
    short = compose_cfg(["shadow=llamagen", "shadow.tiny=true", "shadow.resolution=160"])  # 10 x 10 codes < 158
    with pytest.raises(ValueError, match=r"shadow\.resolution.*100 positions, the model 158"):
        with_shadow(short, toy, [])
    with pytest.raises(ValueError, match=r"shadow\.resolution=512 \(shadow=janus\)"):
        with_shadow(compose_cfg(["shadow=janus", "shadow.tiny=true", "shadow.resolution=512"]), toy, [])
    assert with_shadow(compose_cfg([]), toy, []) is toy  # shadow=none: the model itself


def test_a_run_directory_resumes_only_with_the_shadow_that_timed_it(tmp_path):
    (tmp_path / "samples.jsonl").write_text('{"decoder": "sjd", "prompt_id": "a"}\n')
    (tmp_path / "meta.json").write_text(json.dumps({"shadow": "llamagen", "shadow_layers": 1}))
    check_same_shadow(tmp_path, {"shadow": "llamagen", "shadow_layers": 1})
    with pytest.raises(ValueError, match="would mix their latencies"):
        check_same_shadow(tmp_path, {"shadow": None})


# -- the documented command --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_documented_shadow_run_keeps_the_tokens_and_names_its_shadow(tmp_path):
    """docs/evaluation.md's command, then the same run without the shadow: the same tokens and fingerprint; the
    summary names the shadow (architecture, parameters, layers) and reports the model's own seconds apart."""
    documented = ["model=toy", "decoder=sjd", "shadow=llamagen", "shadow.layers=1", "prompts.n=2", "eval=none"]
    runs = {}
    for name, overrides in (("shadow", documented), ("alone", documented[:2] + documented[4:])):
        run_dir = tmp_path / name
        proc = run_py(*overrides, f"hydra.run.dir={run_dir}", "results_csv=null", "warmup=0", "save_images=false")
        assert proc.returncode == 0, proc.stderr[-3000:]
        samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
        runs[name] = samples, pd.read_csv(run_dir / "summary.csv")
    (shadowed, summary), (alone, plain) = runs["shadow"], runs["alone"]
    assert [s["tokens"] for s in shadowed] == [s["tokens"] for s in alone] and len(shadowed) == 4  # ar, sjd
    assert summary["config_fingerprint"].tolist() == plain["config_fingerprint"].tolist()
    assert summary["shadow"].eq("llamagen").all() and summary["shadow_layers"].eq(1).all()
    assert summary["shadow_params"].gt(1e7).all()  # LlamaGen-XL's width: embeddings and head alone are 42M
    assert json.loads(summary["shadow_settings"].iloc[0])["dtype"] == "float32"
    assert summary["standin_model_s"].gt(0).all() and plain["standin_model_s"].eq(0).all()
    assert plain["shadow"].isna().all()
