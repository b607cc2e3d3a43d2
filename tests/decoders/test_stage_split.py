"""Every decoder splits its decode wall time by stage, and the summary turns the split into fractions."""

from pathlib import Path

import pandas as pd
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.stages import STAGES, StageClock
from sjd.harness.results import STAGE_COLUMNS, summary_rows
from sjd.types import Prompt

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [Prompt("a", "large red circle center"), Prompt("b", "small blue square top left on green")]
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=200)
# One config per decoder implementation: ar, jacobi, sjd, coupled, tree, relaxed, pjd, zipar, sjd2.
DECODERS = ["ar", "jacobi", "sjd", "csjd", "csjd_tree", "gsd", "pjd", "zipar", "sjd2"]
FOR_TOY = {"zipar": {"context": 6}}  # the toy's rows hold 12 codes, fewer than Lumina's context of 16


@pytest.fixture(scope="module")
def toy_sjd2():
    from sjd.sjd2.toy import ToySJD2Adapter

    return ToySJD2Adapter()


@pytest.mark.parametrize("name", DECODERS)
def test_every_decoder_splits_decode_time_into_fractions_that_sum_to_one(name, toy, toy_sjd2):
    conf = OmegaConf.load(ROOT / "conf" / "decoder" / f"{name}.yaml")
    decoder = instantiate(OmegaConf.merge(conf, FOR_TOY.get(name, {})))
    adapter = toy_sjd2 if name == "sjd2" else toy
    decoder.check(adapter)  # as the runner does (GSD builds its neighbour table here)
    result = decoder.generate(adapter, PROMPTS, SAMPLED, make_generators(0, ["a", "b"], adapter.device))
    assert set(result.stage_s) == set(STAGES)
    assert sum(result.stage_s.values()) == pytest.approx(result.decode_s, rel=1e-6)
    assert result.stage_s["forward"] > 0 and result.stage_s["pipeline"] > 0
    if name != "ar":
        assert result.stage_s["draft"] > 0 and result.stage_s["verify"] > 0 and result.stage_s["commit"] > 0

    rows = [{"decoder": name, "decode_s": result.decode_s, "stage_s": result.stage_s} for _ in PROMPTS]
    fracs = summarize_rows(rows).iloc[0][STAGE_COLUMNS].astype(float)
    assert ((fracs >= 0) & (fracs <= 1)).all()
    assert fracs.sum() == pytest.approx(1.0, abs=1e-6)


def summarize_rows(rows: list[dict]) -> pd.DataFrame:
    filler = {"n_tokens": 10, "n_forward": 5, "latency_s": 1.0, "prefill_s": 0.1, "model_s": 0.5}
    filler |= {"accepted": [2, 2], "peak_mem_mb": 0.0, "peak_mem_kind": "none"}
    return summary_rows(pd.DataFrame([filler | r for r in rows]), None, {"model": "toy"})


def test_samples_without_a_split_give_nan_fractions():
    fracs = summarize_rows([{"decoder": "old", "decode_s": 0.9}]).iloc[0][STAGE_COLUMNS].astype(float)
    assert fracs.isna().all()
    fracs = summarize_rows([{"decoder": "unsplit", "decode_s": 0.9, "stage_s": {}}]).iloc[0][STAGE_COLUMNS]
    assert fracs.astype(float).isna().all()


def test_laps_outside_a_running_clock_are_ignored_and_other_takes_the_rest():
    clock = StageClock(torch.device("cpu"))
    clock.lap("draft")  # before begin(): the prefill is not part of the decode split
    assert clock.seconds["draft"] == 0
    clock.begin()
    clock.lap("draft")
    split = clock.split(decode_s=10.0)
    assert split["other"] == pytest.approx(10.0 - split["draft"]) and sum(split.values()) == pytest.approx(10.0)
