"""Runner options that studies need: several seeds per prompt (with resume), the in-run exactness audit."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from sjd.audit.in_run import audit_decoders
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.prompts import load_prompt_set
from sjd.harness.runner import config_fingerprint, run

MICRO = ["model=micro", "decoder.window=4", "eval=none", "results_csv=null", "warmup=0", "logger=csv"]


def micro_cfg(compose_cfg, *overrides):
    return compose_cfg([*MICRO, *overrides])


def samples_of(run_dir):
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def test_each_seed_of_a_prompt_is_a_sample_seeded_as_that_prompt_in_a_run_with_seed_plus_k(compose_cfg, tmp_path):
    cfg = micro_cfg(compose_cfg, "prompts.n=2", "seeds_per_prompt=3", "seed=5", "batch_size=4")
    summary = run(cfg, tmp_path / "run")
    samples = samples_of(tmp_path / "run")
    assert [(s["prompt_id"], s["seed_index"]) for s in samples if s["decoder"] == "sjd"] == [
        ("toy000", 0), ("toy000", 1), ("toy000", 2), ("toy001", 0), ("toy001", 1), ("toy001", 2)
    ]  # fmt: skip
    assert (summary["n_prompts"] == 6).all() and (summary["seeds_per_prompt"] == 3).all()
    assert (tmp_path / "run" / "images" / "sjd" / "toy001_s2.png").is_file()

    adapter = instantiate(cfg.model.adapter, device="cpu")
    sampling = SamplingConfig(**OmegaConf.to_container(cfg.model.sampling))
    prompt = [p for p in load_prompt_set(**OmegaConf.to_container(cfg.prompts)).prompts if p.prompt_id == "toy001"]
    for k in range(3):
        expected = SJDDecoder(window=4).generate(adapter, prompt, sampling, make_generators(5 + k, ["toy001"], "cpu"))
        got = next(s for s in samples if (s["decoder"], s["prompt_id"], s["seed_index"]) == ("sjd", "toy001", k))
        assert got["tokens"] == expected.tokens[0].tolist()
    seed_tokens = {s["seed_index"]: s["tokens"] for s in samples if (s["decoder"], s["prompt_id"]) == ("ar", "toy000")}
    assert len({tuple(t) for t in seed_tokens.values()}) > 1  # the seeds do differ


def test_a_run_with_several_seeds_resumes_the_samples_it_lacks_and_refuses_another_seed_count(compose_cfg, tmp_path):
    cfg = micro_cfg(compose_cfg, "prompts.n=2", "seeds_per_prompt=2")
    run_dir = tmp_path / "run"
    run(cfg, run_dir)
    whole = samples_of(run_dir)
    lines = (run_dir / "samples.jsonl").read_text().splitlines(keepends=True)
    dropped = [json.loads(line) for line in lines[-3:]]
    assert {d["seed_index"] for d in dropped} == {0, 1}  # the cut spans both seed indices
    (run_dir / "samples.jsonl").write_text("".join(lines[:-3]) + lines[-3][:10])  # and a half line
    run(cfg, run_dir)
    resumed = samples_of(run_dir)
    assert [s["latency_s"] for s in resumed[:-3]] == [s["latency_s"] for s in whole[:-3]]  # kept, not redone

    def decoded(samples):
        return [(s["decoder"], s["prompt_id"], s["seed_index"], s["tokens"]) for s in samples]

    assert decoded(resumed) == decoded(whole)

    with pytest.raises(ValueError, match="different run config"):
        run(micro_cfg(compose_cfg, "prompts.n=2", "seeds_per_prompt=3"), run_dir)


def test_one_seed_per_prompt_keeps_the_fingerprint_a_run_without_the_key_had(compose_cfg):
    cfg = micro_cfg(compose_cfg)
    without = OmegaConf.to_container(cfg)
    del without["seeds_per_prompt"]
    assert config_fingerprint(cfg) == config_fingerprint(OmegaConf.create(without))
    assert config_fingerprint(micro_cfg(compose_cfg, "seeds_per_prompt=2")) != config_fingerprint(cfg)


@pytest.mark.parametrize(
    "override, message",
    [
        ("seeds_per_prompt=0", "seeds_per_prompt must be an integer >= 1"),
        ("audit.n=-3", "audit.n must be an integer >= 0"),
        ("audit.batch_size=0", "audit.batch_size must be an integer >= 1"),
        ("audit.n=10", "audit.n=10 needs a caption"),  # the micro model has no audit_prompt
    ],
)
def test_bad_study_options_fail_before_any_work(compose_cfg, tmp_path, override, message):
    cfg = micro_cfg(compose_cfg, "prompts.n=1", override)
    if override == "audit.batch_size=0":
        cfg.audit.n = 10
    with pytest.raises(ValueError, match=message):
        run(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "samples.jsonl").exists()


def test_the_in_run_audit_adds_its_columns_to_the_summary(compose_cfg, tmp_path):
    cfg = micro_cfg(compose_cfg, "prompts.n=1", "audit.n=300", "audit.prompt=a", "audit.batch_size=150")
    summary = run(cfg, tmp_path / "run")
    on_disk = pd.read_csv(tmp_path / "run" / "summary.csv")
    for table in (summary, on_disk):
        assert {"audit_n", "audit_tv", "audit_p", "audit_noise_tv", "lossless_expected"} <= set(table.columns)
    assert (on_disk["audit_n"] == 300).all() and on_disk["audit_p"].between(0, 1).all()
    assert on_disk["audit_noise_tv"].nunique() == 1 and (on_disk["audit_tv"] > 0).all()


class FirstCodeAlwaysZero(ARDecoder):
    """A deliberately wrong decoder: AR, but the first free code is always the first code id."""

    def generate(self, adapter, prompts, sampling, generators):
        result = super().generate(adapter, prompts, sampling, generators)
        first_free = int((adapter.layout.forced < 0).nonzero()[0])
        result.tokens[:, first_free] = adapter.layout.free_token_ids[0]
        return result


def test_the_audit_passes_ar_against_ar_and_fails_a_wrong_decoder(compose_cfg):
    cfg = micro_cfg(compose_cfg, "audit.n=2000", "audit.prompt=a", "audit.batch_size=1000")
    adapter = instantiate(cfg.model.adapter, device="cpu")
    sampling = SamplingConfig(**OmegaConf.to_container(cfg.model.sampling))
    decoders = [ARDecoder(), SJDDecoder(window=4), FirstCodeAlwaysZero(name="wrong")]
    table = audit_decoders(cfg, adapter, decoders, sampling).set_index("decoder")
    assert table.loc["ar", "audit_p"] > 1e-3 and table.loc["sjd", "audit_p"] > 1e-3
    assert table.loc["wrong", "audit_p"] < 1e-6
    assert table.loc["wrong", "audit_tv"] > 5 * table.loc["ar", "audit_noise_tv"]
    # seeded per sample: a second audit of AR draws the same samples
    again = audit_decoders(cfg, adapter, [ARDecoder()], sampling).set_index("decoder")
    assert np.isclose(again.loc["ar", "audit_tv"], table.loc["ar", "audit_tv"])


def test_audit_samples_do_not_depend_on_the_audit_batch(compose_cfg):
    adapter_cfg = micro_cfg(compose_cfg, "audit.n=40", "audit.prompt=a")
    adapter = instantiate(adapter_cfg.model.adapter, device="cpu")
    sampling = SamplingConfig(**OmegaConf.to_container(adapter_cfg.model.sampling))
    tables = []
    for batch in (40, 7):
        adapter_cfg.audit.batch_size = batch
        tables.append(audit_decoders(adapter_cfg, adapter, [SJDDecoder(window=4)], sampling))
    pd.testing.assert_frame_equal(*tables)
