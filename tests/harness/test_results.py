"""sjd.harness.results.summary_rows: the in-run forward cost and efficiency that keep decoder bookkeeping visible."""

import math

import pandas as pd
import pytest

from sjd.harness.results import summary_rows


def samples(decoder: str, n_forward: int, latency_s: float, model_s: float, n: int = 2) -> list[dict]:
    accepted = [10 // n_forward] * n_forward
    return [
        {"decoder": decoder, "prompt_id": str(i), "n_tokens": 10, "n_forward": n_forward, "latency_s": latency_s,
         "prefill_s": 0.01, "decode_s": latency_s - 0.01, "model_s": model_s, "accepted": accepted,
         "peak_mem_mb": 1.0, "peak_mem_kind": "process_rss"}
        for i in range(n)
    ]  # fmt: skip


def test_efficiency_is_speedup_over_what_model_time_allows():
    # AR: 10 one-token forwards, 0.9 s of its 1.0 s in the model. The decoder: 2 forwards of 0.15 s
    # (each costs 1.67 one-token forwards), 0.3 s of its 0.5 s in the model.
    table = pd.DataFrame(samples("ar", 10, 1.0, 0.9) + samples("sjd", 2, 0.5, 0.3))
    rows = summary_rows(table, "ar", {"model": "toy"}).set_index("decoder")
    assert rows.loc["sjd", "step_compression"] == 5.0 and rows.loc["sjd", "latency_speedup"] == pytest.approx(2.0)
    assert rows.loc["sjd", "forward_cost"] == pytest.approx(0.15 / 0.09)
    # At best 5 / 1.67 = 3x faster; it is 2x faster: two thirds, = its model-time share over AR's.
    assert rows.loc["sjd", "efficiency"] == pytest.approx(2 / 3)
    assert rows.loc["sjd", "efficiency"] == pytest.approx((0.3 / 0.5) / (0.9 / 1.0))
    assert rows.loc["ar", "forward_cost"] == 1.0 and rows.loc["ar", "efficiency"] == 1.0


def test_slower_bookkeeping_lowers_efficiency_not_forward_cost():
    lean = summary_rows(pd.DataFrame(samples("ar", 10, 1.0, 0.9) + samples("x", 2, 0.4, 0.3)), "ar", {"model": "toy"})
    heavy = summary_rows(pd.DataFrame(samples("ar", 10, 1.0, 0.9) + samples("x", 2, 0.8, 0.3)), "ar", {"model": "toy"})
    lean, heavy = lean.set_index("decoder").loc["x"], heavy.set_index("decoder").loc["x"]
    assert lean.forward_cost == pytest.approx(heavy.forward_cost)
    assert heavy.efficiency == pytest.approx(lean.efficiency / 2)


def test_without_a_baseline_there_is_nothing_to_compare():
    rows = summary_rows(pd.DataFrame(samples("sjd", 2, 0.5, 0.3)), None, {"model": "toy"})
    assert math.isnan(rows.loc[0, "efficiency"]) and math.isnan(rows.loc[0, "forward_cost"])


# The keys samples.jsonl has always had, in their order: resume, the merge and the tests read them by name.
SAMPLE_KEYS = ["prompt_id", "prompt", "seed_index", "seed", "decoder", "n_tokens", "n_forward", "latency_s",
               "prefill_s", "decode_s", "model_s", "stage_s", "image_decode_s", "batch_size", "peak_mem_mb",
               "peak_mem_kind", "accepted", "entropy_nats", "tokens"]  # fmt: skip


def test_a_sample_record_keeps_the_line_format_and_each_rows_share_of_the_decoders_extras(tmp_path):
    import json

    import torch

    from sjd.decoders.base import DecodeResult
    from sjd.harness.results import SampleRecord, SampleWriter
    from sjd.types import Prompt

    result = DecodeResult(
        tokens=torch.tensor([[1, 2, 3], [4, 5, 6]]), n_forward=[3, 2], accepted=[[1, 1, 1], [1, 2]],
        prefill_s=0.1, decode_s=0.2, model_s=0.25, stage_s={"forward": 0.15},
        extras={"stage_laps": 7, "branch_commits": [0, 1], "per_row": torch.tensor([2.0, 3.0])},
    )  # fmt: skip
    writer = SampleWriter(tmp_path)
    for row, prompt in enumerate([Prompt("a", "a cat"), Prompt("b", "a dog")]):
        peak = (5.0, "process_rss")
        record = SampleRecord.of_row(result, row, prompt, 1, 99 + row, "tree", float("nan"), peak, "a#1")
        writer.write(record)
    first, second = (json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines())
    assert list(second) == [*SAMPLE_KEYS, "extras", "timed_batch", "standin_model_s"]
    assert first["timed_batch"] == second["timed_batch"] == "a#1"  # both rows were timed in one batch
    assert second["tokens"] == [4, 5, 6] and second["n_forward"] == 2 and second["accepted"] == [1, 2]
    assert second["n_tokens"] == 3 and second["batch_size"] == 2 and second["seed"] == 100
    assert second["latency_s"] == pytest.approx(0.3) and second["entropy_nats"] is None
    assert first["extras"] == {"stage_laps": 7, "branch_commits": 0, "per_row": 2.0}  # the batch's, then row 0's
    assert second["extras"] == {"stage_laps": 7, "branch_commits": 1, "per_row": 3.0}


def test_fe_compression_prices_drafter_forwards_at_the_drafters_byte_ratio():
    """AR's forwards over the decoder's target forwards plus its drafter forwards at their price: a hybrid of 2
    target and 16 drafter forwards at 0.075 a forward is 10 / 3.2, against a step compression of 5; a decoder
    without a drafter keeps AR's forwards over its own; a drafter decoder on a model with no price has none."""
    hybrid = [s | {"extras": {"drafter_forwards": 16}} for s in samples("hybrid", 2, 0.5, 0.3)]
    table = pd.DataFrame(samples("ar", 10, 1.0, 0.9) + samples("sjd", 2, 0.5, 0.3) + hybrid)
    rows = summary_rows(table, "ar", {"model": "standin", "drafter_byte_ratio": 0.075}).set_index("decoder")
    assert rows.loc["hybrid", "step_compression"] == 5.0
    assert rows.loc["hybrid", "fe_compression"] == pytest.approx(10 / (2 + 16 * 0.075))
    assert rows.loc["sjd", "fe_compression"] == 5.0 and rows.loc["ar", "fe_compression"] == 1.0
    unpriced = summary_rows(table, "ar", {"model": "toy", "drafter_byte_ratio": None}).set_index("decoder")
    assert math.isnan(unpriced.loc["hybrid", "fe_compression"]) and unpriced.loc["sjd", "fe_compression"] == 5.0


def test_every_model_that_stands_for_a_real_one_names_its_price(compose_cfg):
    """The stand-ins price as the architecture they stand for, the real models as themselves (run meta's
    prices_as and drafter_byte_ratio); an unknown name is refused, naming the key."""
    from sjd.harness.runner import pricing

    lumina = pricing(compose_cfg(["model=standin_lumina_512_cal"]))
    assert lumina["prices_as"] == "chameleon_7b" and lumina["drafter_byte_ratio"] == pytest.approx(0.0748, abs=5e-4)
    assert pricing(compose_cfg(["model=standin_llamagen_512"]))["prices_as"] == "llamagen_xl"
    assert pricing(compose_cfg(["model=toy"])) == {"prices_as": None, "drafter_byte_ratio": None}
    with pytest.raises(ValueError, match="model.prices_as='gpt5'"):
        pricing(compose_cfg(["model=lumina", "model.prices_as=gpt5"]))
