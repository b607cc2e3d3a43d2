"""Window schedules (sjd.core.schedule): the official SJD loop's rule, written out, on Lumina-mGPT
layouts at 768 and 128 px; the decoders follow it; it stays exact; bad values fail early."""

from pathlib import Path

import pytest
import torch

from sjd.core.sampling import SamplingConfig
from sjd.core.schedule import JacobiInterval, OfficialSchedule, make_schedule, official_interval
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.coupled import CoupledSJDDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.sjd_pac import SJDPACDecoder
from sjd.harness.prompts import load_prompt_file
from sjd.models.chameleon import ChameleonVocab
from sjd.models.lumina import END_OF_LINE, GRID_PX, lumina_layout, size_token

PROMPTS = load_prompt_file("sjd/assets/prompts/toy.tsv")[:3]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0)


def lumina_at(px: int):
    """A Lumina-mGPT layout at `px` pixels, from a vocabulary with just the ids it names."""
    names = {size_token(g): 8800 + g for g in range(1, 33)} | {END_OF_LINE: 8799}
    vocab = ChameleonVocab(
        bos=0, image_start=1, image_end=2, end_of_turn=3, code_ids=torch.arange(4, 8196), vocab_size=8900, names=names
    )
    return lumina_layout(vocab, px // GRID_PX, px // GRID_PX, "lumina")


def gens(prompts, seed=0):
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


def test_lumina_interval_is_the_official_scripts_at_768_and_128_px():
    big, small = lumina_at(768), lumina_at(128)
    assert (big.n_tokens, big.height, big.row_stride) == (2357, 48, 49)
    assert official_interval("lumina", big, 16) == JacobiInterval(1, 48**2 + 48 - 10) == JacobiInterval(1, 2342)
    assert (small.n_tokens, small.height) == (3 + 8 * 9 + 2, 8)
    assert official_interval("lumina", small, 16) == JacobiInterval(1, 8**2 + 8 - 10) == JacobiInterval(1, 62)


def test_official_widths_at_768_px_single_steps_lag_and_cap_at_r():
    s = make_schedule("official", 16, 1, 0, lumina_at(768), "lumina")
    # (committed, committed one iteration earlier) -> window
    assert s.width(1, 0) == 1  # the prefill's token was committed at length 0 < l: one token
    assert s.width(2, 1) == 16  # from l on: full windows
    assert s.width(2330, 2314) == 16
    assert s.width(2340, 2330) == 12  # the lag: r - 2330, not r - 2340
    assert s.width(2350, 2340) == 2  # capped at r from where the row stood one commit ago
    assert s.width(2343, 2342) == 1  # from r on: one token per forward to the end
    assert s.width(2356, 2355) == 1
    assert s.width(2357, 2356) == 0  # complete


def test_official_widths_at_128_px_follow_a_trajectory_of_accepted_counts():
    s = make_schedule("official", 16, 1, 0, lumina_at(128), "lumina")  # l = 1, r = 62, 77 tokens
    takes = [1, 16, 16, 16, 10, 12, 2, 1, 1, 1]  # tokens each forward commits (never more than its window)
    committed, previous, widths = 1, 0, []
    for take in takes:
        widths.append(s.width(committed, previous))
        previous, committed = committed, committed + take
    widths.append(s.width(committed, previous))
    # g_prev:  0   1   2  18  34  50  60  72 74 75 | 76 (committed 77)
    assert widths == [1, 16, 16, 16, 16, 12, 2, 1, 1, 1, 0]
    # The window after g_prev = 50 starts at 60 and spans 12 slots: the lag lets it cross r = 62.


def test_harness_schedule_is_unchanged():
    s = make_schedule("harness", 16, 3, 5, lumina_at(128), "lumina")
    assert [s.width(c, 0) for c in (1, 2, 3, 60, 71, 72, 76, 77)] == [1, 1, 16, 16, 6, 1, 1, 0]


def test_adaptive_windows_are_twice_the_last_commit_between_the_floor_and_the_window():
    s = make_schedule("adaptive", 16, 3, 5, lumina_at(128), "lumina")  # 77 tokens
    # (committed, previous): the prefix and suffix are single steps; else 2 x (committed - previous),
    # within [4, 16] and the tokens left (7 at (70, 60))
    cases = {(1, 0): 1, (3, 2): 4, (10, 8): 4, (13, 10): 6, (20, 12): 16, (40, 10): 16, (70, 60): 7, (72, 60): 1}
    assert {k: s.width(*k) for k in cases} == cases
    assert s.width(77, 70) == 0


def test_windows_never_pass_the_image_end():
    s = OfficialSchedule(64, JacobiInterval(1, 10_000), n_tokens=100)
    assert s.width(90, 30) == 10


class WindowRecorder:
    """Wraps an adapter and records each forward's window width (batch of one row)."""

    def __init__(self, adapter):
        self.adapter, self.widths = adapter, []

    def __getattr__(self, name):
        return getattr(self.adapter, name)

    def forward(self, tokens, start):
        self.widths.append(tokens.shape[1])
        return self.adapter.forward(tokens, start)

    def forward_at(self, tokens, positions, keep, window_mask, transient=None):
        self.widths.append(int((positions[0] >= 0).sum()))
        return self.adapter.forward_at(tokens, positions, keep, window_mask, transient)


@pytest.mark.parametrize(
    "decoder",
    [
        SJDDecoder(window=16, schedule="official"),
        CoupledSJDDecoder(window=16, schedule="official"),
        SJDPACDecoder(window=16, branches=2, branch_depth=1, schedule="official"),
    ],
    ids=["sjd", "csjd", "tree"],
)
def test_decoders_run_the_official_windows(toy, decoder):
    expected = windows_follow_the_schedule(toy, decoder)
    assert max(expected) == 16 and expected[0] == 1
    assert decoder.window_schedule(toy).interval == JacobiInterval(1, 12 * 13)  # the toy's generic rule: 12 x 13


ADAPTIVE = [SJDDecoder(window=16, schedule="adaptive"), CoupledSJDDecoder(window=16, schedule="adaptive")]


@pytest.mark.parametrize("decoder", ADAPTIVE, ids=["sjd", "csjd"])
def test_decoders_run_the_adaptive_windows(toy, decoder):
    expected = windows_follow_the_schedule(toy, decoder)
    assert min(expected[1:-1]) >= 4 and len(set(expected[1:])) > 2  # the width moved with what was committed


def windows_follow_the_schedule(toy, decoder) -> list[int]:
    """The windows each decoder forwards are the schedule's, replayed from its own accepted counts."""
    recorder = WindowRecorder(toy)
    res = decoder.generate(recorder, PROMPTS[:1], SAMPLED, gens(PROMPTS[:1]))
    schedule = decoder.window_schedule(toy)
    committed, previous, expected = 1, 0, []
    for take in res.accepted[0][1:]:
        expected.append(schedule.width(committed, previous))
        previous, committed = committed, committed + take
    assert committed == toy.layout.n_tokens and schedule.width(committed, previous) == 0
    if isinstance(decoder, SJDPACDecoder):  # siblings and lead-in count in the window
        assert all(w <= e for w, e in zip(recorder.widths, expected)) and len(recorder.widths) == len(expected)
    else:
        assert recorder.widths == expected
        assert res.extras["window_inputs"] == [sum(expected)]  # what inputs_per_token sums
    return expected


def test_official_l_on_a_128_px_lumina_layout_single_steps_the_first_l_tokens_and_one_more():
    """l = 1 (the evaluation loaders') against l = 3 (the demo script's): after the prefill's token, l
    tokens are decoded one per forward (the window lags one commit), so with l = 3 the first window
    starts after begin-of-image (the prefill's), both size tokens and the first code."""
    layout = lumina_at(128)
    for official_l, single_steps in ((1, 1), (3, 3)):
        s = make_schedule("official", 16, 1, 0, layout, "lumina", official_l)
        assert s.interval == JacobiInterval(official_l, 62)
        committed, previous, widths = 1, 0, []
        while (width := s.width(committed, previous)) == 1:  # one token per forward until the first window
            widths.append(width)
            previous, committed = committed, committed + 1
        assert widths == [1] * single_steps and width == 16 and committed == official_l + 1


@pytest.mark.parametrize("official_l, leading_single_steps", [(1, 1), (3, 3)])
def test_the_windows_forwarded_follow_official_l(toy, official_l, leading_single_steps):
    """The windows SJD actually forwards on the toy: after the prefill, `official_l` single-token
    forwards, then full windows; the whole sequence is the schedule's, replayed from the accepted counts."""
    decoder = SJDDecoder(window=8, schedule="official", official_l=official_l, forced_drafts=False)
    recorder = WindowRecorder(toy)
    res = decoder.generate(recorder, PROMPTS[:1], SAMPLED, gens(PROMPTS[:1]))
    assert recorder.widths[: leading_single_steps + 1] == [1] * leading_single_steps + [8]
    schedule = decoder.window_schedule(toy)
    assert schedule.interval.l == official_l
    committed, previous, expected = 1, 0, []
    for take in res.accepted[0][1:]:
        expected.append(schedule.width(committed, previous))
        previous, committed = committed, committed + take
    assert recorder.widths == expected and committed == toy.layout.n_tokens


def test_official_l_is_checked_and_recorded():
    with pytest.raises(ValueError, match=r"decoder\.official_l must be an integer >= 1, got 0"):
        SJDDecoder(schedule="official", official_l=0)
    assert SJDDecoder().config()["official_l"] == 1
    assert CoupledSJDDecoder(official_l=3).config()["official_l"] == 3


def test_greedy_official_sjd_equals_greedy_ar(toy):
    ar = ARDecoder().generate(toy, PROMPTS, GREEDY, gens(PROMPTS))
    sjd = SJDDecoder(window=16, schedule="official").generate(toy, PROMPTS, GREEDY, gens(PROMPTS, seed=7))
    assert torch.equal(ar.tokens, sjd.tokens)
    assert all(n < toy.layout.n_tokens for n in sjd.n_forward)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["official", "adaptive"])
@pytest.mark.parametrize("decoder", ["sjd", "csjd"])
def test_the_other_schedules_pass_the_exact_audit(run_audit, decoder, schedule):
    # adaptive: the micro model's 8 tokens, so that widths move between the floor (4) and the window
    wide = ["micro_decoder.window=8"] if schedule == "adaptive" else []
    report = run_audit([f"decoder={decoder}", f"decoder.schedule={schedule}", "n_samples=20000", *wide])
    assert report["decoder_config"]["schedule"] == schedule
    assert report["p_value"] > 1e-3, report
    assert report["tv_distance"] < 2 * report["ar_tv_distance"] + 0.01, report


def test_an_unknown_schedule_fails_naming_the_key():
    expected = r"decoder\.schedule must be one of \('harness', 'official', 'adaptive'\), got 'paper'"
    with pytest.raises(ValueError, match=expected):
        SJDDecoder(schedule="paper")
    with pytest.raises(ValueError, match=r"decoder\.schedule"):
        CoupledSJDDecoder(schedule="offical")


def test_the_schedule_is_recorded_in_the_summary_rows():
    import pandas as pd

    from sjd.harness.results import summary_rows

    rows = [
        {"decoder": d, "prompt_id": "p", "n_tokens": 10, "n_forward": 5, "latency_s": 1.0, "prefill_s": 0.1,
         "decode_s": 0.9, "model_s": 0.8, "accepted": [1, 2, 2, 2, 3], "peak_mem_mb": 0.0, "peak_mem_kind": "cpu"}
        for d in ("ar", "sjd", "sjd_harness")
    ]  # fmt: skip
    configs = {"ar": ARDecoder().config(), "sjd": SJDDecoder(schedule="official").config()}
    configs["sjd_harness"] = SJDDecoder(name="sjd_harness").config()
    summary = summary_rows(pd.DataFrame(rows), "ar", {"model": "toy", "decoder_configs": configs}).set_index("decoder")
    assert summary["schedule"].to_dict() == {"ar": "", "sjd": "official", "sjd_harness": "harness"}
    assert summary["inputs_per_token"].isna().all()  # the rows record no window inputs


def test_inputs_per_token_sums_the_window_inputs_over_the_generated_tokens():
    import pandas as pd

    from sjd.harness.results import summary_rows

    rows = [
        {"decoder": d, "prompt_id": p, "n_tokens": 10, "n_forward": 5, "latency_s": 1.0, "prefill_s": 0.1,
         "decode_s": 0.9, "model_s": 0.8, "accepted": [1, 2, 2, 2, 3], "peak_mem_mb": 0.0, "peak_mem_kind": "cpu",
         "extras": {"window_inputs": inputs}}
        for d, p, inputs in (("ar", "a", 9), ("ar", "b", 9), ("sjd", "a", 30), ("sjd", "b", 50))
    ]  # fmt: skip
    configs = {"ar": ARDecoder().config(), "sjd": SJDDecoder().config()}
    summary = summary_rows(pd.DataFrame(rows), "ar", {"model": "toy", "decoder_configs": configs}).set_index("decoder")
    assert summary["inputs_per_token"].to_dict() == {"ar": 0.9, "sjd": 4.0}


@pytest.mark.parametrize(
    "table",
    [
        "sjd_lumina_coco5k",
        "pjd_lumina_coco5k",
        "pjd_llamagen_coco5k",
        "sjd2_lumina_coco",
        "sjd2_emu3_coco",
        "scd_lumina_coco5k",
        "sjd_pac_lumina_coco5k",
    ],  # fmt: skip
)
def test_paper_overlays_run_the_official_schedule_beside_the_harness_one(compose_cfg, table):
    """Rows named as a published method reproduce the paper's schedule; `<name>_harness` rows sit beside them."""
    import pandas as pd

    from sjd.harness.runner import build_decoders

    cfg = compose_cfg([f"experiment={table}"])
    decoders = {d.name: d for d in build_decoders(cfg)[0]}
    published_csv = Path(__file__).resolve().parents[2] / "results" / "paper" / "published.csv"
    published = set(pd.read_csv(published_csv).query("table == @table")["method"])
    on_sjd_loop = [name for name, d in decoders.items() if hasattr(d, "schedule") and name in published]
    assert on_sjd_loop, f"{table}: no published method runs on SJD's loop"
    for name in on_sjd_loop:
        assert decoders[name].schedule == "official", name
        assert decoders[f"{name}_harness"].schedule == "harness", name
