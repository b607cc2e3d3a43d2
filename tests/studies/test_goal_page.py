"""The goal page: each lossless candidate against official SJD at window 16 and the faster of SJD-PAC and SCD at
window 64, in latency (measured, or modelled over the cost model's whole range), with step compression shown beside
it, and a verdict on each target only for candidates whose one-sample audit passes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from studies.goal_page import goal_section, target_verdict
from studies.overlays import load_studies
from studies.regime_page import PUBLISHED

ROOT = Path(__file__).resolve().parents[2]
GOAL = load_studies(ROOT / "conf" / "experiment")["beyond_sjd_pac"][0].goal  # the overlay's study.goal

COMMAND = "python run.py experiment=beyond_sjd_pac"
# decoder -> (window, step compression, one-sample p); AR's p is the control
RUN = {
    "ar": (None, 1.0, 0.5),
    "sjd_official": (16, 2.0, 0.4),
    "scd_official_w64": (64, 3.8, 0.3),
    "sjd_pac_official_w64": (64, 4.0, 0.6),
    "csjd_official": (16, 4.2, 0.2),  # 2.1x SJD
    "csjd_harness": (16, 5.4, 1e-6),  # 2.7x SJD, but its audit fails: never the goal's decoder
    "csjd_pac_w64": (64, 5.2, 0.7),  # 1.3x SJD-PAC
    "gsd": (16, 9.0, 0.9),  # lossy: not a candidate
}


def settings(decoder: str, window: int) -> dict:
    """A decoder config as runs record it: its name, its window, and a setting that tells the algorithms apart
    (what a real config's other settings do)."""
    return {"name": decoder, "window": window, "algorithm": decoder.removesuffix("_w64")}


def run_rows(run_dir: str = "r1", spread: float = 0.05, control_p: float = 0.5) -> pd.DataFrame:
    decoders = list(RUN)
    sjd, pac = RUN["sjd_official"][1], RUN["sjd_pac_official_w64"][1]
    rows = pd.DataFrame(
        {
            "decoder": decoders,
            "schedule": ["", "official", "official", "official", "official", "harness", "harness", "harness"],
            "step_compression": [RUN[d][1] for d in decoders],
            "vs_sjd_official": [RUN[d][1] / sjd for d in decoders],
            "vs_sjd_pac_official_w64": [RUN[d][1] / pac for d in decoders],
            "tf_p": [control_p if d == "ar" else RUN[d][2] for d in decoders],
            "tf_control_p": control_p,
            "tf_n_tokens": 16384,
            "tf_tokens_needed": 500_000.0,
        }
    )
    for column in ("step_compression", "vs_sjd_official", "vs_sjd_pac_official_w64"):
        rows[f"{column}_lo"], rows[f"{column}_hi"] = rows[column] * (1 - spread), rows[column] * (1 + spread)
    configs = {d: settings(d, w) for d, (w, _, _) in RUN.items() if w is not None} | {"ar": {}}
    lossless = {d: d != "gsd" for d in decoders}
    rows = rows.assign(model="standin_lumina_512_cal", baseline="ar", entropy_nats=5.0, command=COMMAND,
                       run_dir=run_dir, n_captions=16, decoder_configs=json.dumps(configs),
                       decoder_lossless=json.dumps(lossless))  # fmt: skip
    return priced(rows, {d: w or 1 for d, (w, _, _) in RUN.items()}, spread)


def priced(rows: pd.DataFrame, widths: dict[str, int], spread: float) -> pd.DataFrame:
    """The counts the cost model prices, as a run priced as Chameleon-7B records them: a 1000-token image, each
    decoder's forwards from its step compression at its window, the same calls and syncs an iteration for all (a
    class no sync count knows), and each modelled ratio's interval over prompts at +-`spread`. Decoders of one
    window then differ only in their forwards: their latency ratio is their step compression's at every corner."""
    rows = rows.assign(n_forward=1000 / rows["step_compression"], priced_context=500.0,
                       priced_width=rows["decoder"].map(widths).fillna(64), decoder_ops_per_iter=100.0,
                       syncs_per_iter=1.0, prices_as="chameleon_7b", sampling=json.dumps({"cfg_scale": 3.0}),
                       decoder_classes=json.dumps({}), compiled=False, drafter_forwards=np.nan)  # fmt: skip
    for ref in ("sjd_official", "sjd_pac_official_w64", "scd_official_w64"):
        column = f"modelled_vs_{ref}"
        rows[column], rows[f"{column}_lo"], rows[f"{column}_hi"] = 1.0, 1.0 - spread, 1.0 + spread
    return rows


def section(rows: pd.DataFrame, powered: pd.DataFrame | None = None) -> str:
    return "\n".join(goal_section(rows, [COMMAND], pd.read_csv(PUBLISHED), GOAL, powered))


def powered_rows(decoder: str, p: float, window: int = 64, control_p: float = 0.5, tokens: int = 458_752,
                 name: str | None = None):  # fmt: skip
    """An audit_powered run: AR (the control) and `decoder`'s settings with `window`, on the goal run's model,
    under the row name `name` (the decoder's own by default)."""
    name = name or decoder
    configs = json.dumps({"ar": {}, name: settings(decoder, window) | {"name": name}})
    decoder = name
    return pd.DataFrame(
        {
            "decoder": ["ar", decoder],
            "tf_p": [control_p, p],
            "tf_control_p": control_p,
            "tf_n_tokens": tokens,
            "tf_tokens_needed": 400_000.0,
            "model": "standin_lumina_512_cal",
            "decoder_configs": configs,
            "experiment": "audit_powered_w64",
        }
    )


def test_the_goal_names_the_best_passing_candidate_at_each_window_with_its_verdict():
    text = section(run_rows())
    # window 16: csjd_harness compresses more but fails its audit; csjd_official is the goal's decoder
    assert "Window 16: the best is `csjd_official` at 2.10 [1.99-2.21; eager 2.10, compiled 2.10, graphed 2.10]" in text
    assert "times the latency of `sjd_official`" in text
    assert "The 2.5x target is missed over the model's whole range" in text
    assert "Window 64: the best is `csjd_pac_w64` at 1.30 [1.23-1.37;" in text
    assert "times the latency of the faster of `sjd_pac_official_w64` and `scd_official_w64`" in text
    assert "(the faster is `sjd_pac_official_w64` on every engine)" in text
    assert "its step compression is 1.30 (1.23-1.37) times `sjd_pac_official_w64`'s (shown, not decisive)" in text
    assert "The 1.25x target is not distinguishable from it: the range includes it on every engine" in text
    assert "decided by the cost model over its range" in text
    assert "without power (needs 500000 tokens)" in text
    assert "| gsd |" not in text  # lossy: not a candidate
    # the references lead the table, SCD beside SJD-PAC, each with its step compression
    assert "| sjd_pac_official_w64 | reference | official | 64 | 4.00 (3.80-4.20) |" in text
    assert "| scd_official_w64 | reference | official | 64 | 3.80 (3.61-3.99) |" in text
    assert "| csjd_harness | candidate | harness | 16 |" in text
    assert "| 1e-06 | - | False |" in text  # its failing audit


def test_the_target_is_decided_on_latency_and_step_compression_is_never_decisive():
    """A candidate whose step compression clears 1.25x SJD-PAC's but whose own calls between forwards cost more
    than its saved forwards misses in latency; rows without the counts the model prices decide nothing."""
    rows = run_rows(spread=0.01)
    rows.loc[rows["decoder"] == "csjd_pac_w64", "decoder_ops_per_iter"] = 20_000.0
    text = section(rows)
    assert "its step compression is 1.30 (1.29-1.31) times `sjd_pac_official_w64`'s (shown, not decisive)" in text
    assert "The 1.25x target is missed over the model's whole range" in text
    old = run_rows(spread=0.01).drop(columns=["priced_context"])
    assert ("Window 64: no lossless candidate whose one-sample audit passes has a latency, measured or modelled, over "
            "the faster of `sjd_pac_official_w64` and `scd_official_w64`.") in section(old)  # fmt: skip


def test_a_narrow_interval_above_the_target_meets_it_and_a_failing_control_voids_every_candidate():
    assert target_verdict(1.26, 1.34, 1.25).startswith("met")
    assert target_verdict(1.9, 2.1, 2.5).startswith("missed")
    assert target_verdict(2.4, 2.8, 2.5).startswith("not distinguishable")
    assert "no interval" in target_verdict(np.nan, np.nan, 2.5)
    text = section(run_rows(spread=0.01))
    assert "The 1.25x target is met over the model's whole range" in text
    text = section(run_rows(control_p=1e-9))  # AR fails: the teacher-forced and decoding paths disagree
    assert "Window 16: no lossless candidate whose one-sample audit passes" in text
    assert "Window 64: no lossless candidate whose one-sample audit passes" in text


def test_the_latest_run_counts_and_the_calibration_of_its_stand_in_is_stated():
    text = section(pd.concat([run_rows(spread=0.01), run_rows(run_dir="r2")]))
    assert "1.25x target is not distinguishable" in text and "The 1.25x target is met" not in text
    assert "this run's stand-in is calibrated (every anchor's interval" in text  # 2.0 / 2.22, 1.9 / 1.90, 2.0 / 2.03
    off = run_rows(run_dir="r3")
    for column in ("vs_sjd_official", "vs_sjd_official_lo", "vs_sjd_official_hi"):
        off.loc[off["decoder"] == "scd_official_w64", column] *= 1.3
    assert "this run's stand-in is not calibrated: SCD over SJD 1.30 (1.24-1.37) of published" in section(off)


def test_a_powered_audit_of_the_same_decoder_and_settings_decides_audited_lossless():
    text = section(run_rows(), powered_rows("csjd_pac_w64", 0.42))
    assert "| 0.7 | 0.42 (458752; n/a: no hash) | True |" in text
    assert ("one-sample p = 0.42 on 458752 tokens in `experiment=audit_powered_w64` (same weights: n/a: no hash), "
            "with power") in text  # fmt: skip
    # where the best passing candidate is not the one audited with power, the audited one is named too
    text = section(run_rows(), powered_rows("csjd_official", 0.42, window=16))
    assert "Window 16: the best is `csjd_official` at 2.10 [" in text
    assert ("The 2.5x target is missed over the model's whole range (every engine and constant, and the prompts); "
            "decided by the cost model over its range. Its one-sample p = 0.42 on 458752 tokens") in text  # fmt: skip
    rows = run_rows()
    rows.loc[rows["decoder"] == "csjd_harness", "tf_p"] = 0.3  # now the best passing at window 16, unaudited
    text = section(rows, powered_rows("csjd_official", 0.42, window=16))
    assert "Window 16: the best is `csjd_harness` at 2.70 [" in text
    assert (
        "without power (needs 500000 tokens). It was picked among 2 candidates by its point estimate, so the met is "
        "pending a confirming run of it alone beside the references on fresh prompts and seeds. "
        "The best audited with power is `csjd_official` at 2.10 [1.99-2.21; eager 2.10, compiled 2.10, graphed "
        "2.10]; the target is missed over the model's whole range (every engine and constant, and the prompts); "
        "decided by the cost model over its range. Its one-sample p = 0.42 on 458752 tokens in "
        "`experiment=audit_powered_w64` (same weights: n/a: no hash), with power."
    ) in text
    # another window is another decoder: its audit backs nothing here
    text = section(run_rows(), powered_rows("csjd_pac_w64", 0.42, window=16))
    assert "| 0.7 | - | unknown |" in text
    # a powered audit that rejects the decoder takes it out of the goal, though its own small audit passed
    text = section(run_rows(), powered_rows("csjd_pac_w64", 1e-5))
    assert "| 0.7 | 1e-05 (458752; n/a: no hash) | False |" in text
    assert "Window 64: no lossless candidate whose one-sample audit passes" in text
    # too few tokens: the small run's own verdict stands
    text = section(run_rows(), powered_rows("csjd_pac_w64", 0.42, tokens=100_000))
    assert "| 0.7 | 0.42 (100000; n/a: no hash) | unknown |" in text


def test_a_wider_window_says_whether_the_window_limits():
    rows = run_rows()
    wide = rows[rows["decoder"] == "csjd_pac_w64"].assign(decoder="csjd_pac_w256")
    configs = json.loads(rows["decoder_configs"].iloc[0]) | {"csjd_pac_w256": {"window": 256}}
    lossless = json.loads(rows["decoder_lossless"].iloc[0]) | {"csjd_pac_w256": True}
    rows = pd.concat([rows, wide]).assign(decoder_configs=json.dumps(configs), decoder_lossless=json.dumps(lossless))
    text = section(rows)
    assert (
        "- Window 256 (is the window the limit?): the best is `csjd_pac_w256` at step compression 5.20 (4.94-5.46), "
        "2.60 (2.47-2.73) times `sjd_official` and 1.30 (1.23-1.37) times `sjd_pac_official_w64`, against 5.20 for "
        "the best at window 64 (`csjd_pac_w64`)."
    ) in text


def test_each_candidate_shows_the_share_of_its_forwards_that_committed_one_code():
    rows = run_rows()
    hist = {"csjd_pac_w64": {"1": 30, "2": 10, "5": 10}, "csjd_official": {"2": 4}}
    rows["accept_hist"] = [json.dumps(hist[d]) if d in hist else np.nan for d in rows["decoder"]]
    lines = {line.split("|")[1].strip(): line for line in section(rows).splitlines() if line.startswith("| csjd")}
    assert "| 60% |" in lines["csjd_pac_w64"] and "| 0% |" in lines["csjd_official"]
    assert "|  | 1e-06 |" in lines["csjd_harness"]  # no histogram, no share


def test_the_window_16_target_is_also_read_against_the_best_candidate_at_any_window():
    text = section(run_rows())
    # csjd_pac_w64 (5.2) compresses 2.6x sjd_official: read at SJD's window, the target is a window-64 decoder's
    assert (
        "- Any window against `sjd_official` at window 16 (the target read as SJD's window, not the candidate's): "
        "the best is `csjd_pac_w64` at window 64, "
    ) in text
    line = next(x for x in text.splitlines() if x.startswith("- Any window"))
    assert "decided by the cost model over its range" in line
    rows = run_rows()
    only16 = rows[~rows["decoder"].isin(["csjd_pac_w64"])]
    assert "Any window" not in section(only16)  # the best is the window-16 candidate: nothing more to say


def test_the_regime_and_goal_pages_agree_on_what_is_audited_with_power():
    """One source of truth: both read a decoder's audit with power through regime.powered_audit, so where one
    matches, the regime map's audited_lossless and the goal page's are the same, passing or failing."""
    from studies import regime
    from studies.goal_page import candidate_rows

    rows = run_rows()
    rows.loc[len(rows)] = rows.loc[rows["decoder"] == "sjd_official"].iloc[0].to_dict() | {"decoder": "sjd_harness"}
    configs = json.loads(rows["decoder_configs"].iloc[0]) | {"sjd_harness": settings("sjd_harness", 16)}
    lossless = json.loads(rows["decoder_lossless"].iloc[0]) | {"sjd_harness": True}
    rows = rows.assign(decoder_configs=json.dumps(configs), decoder_lossless=json.dumps(lossless), n_prompts=16,
                       latency_speedup=1.0, efficiency=1.0)  # fmt: skip
    for p, expected in ((0.42, True), (1e-6, False)):
        powered = pd.concat([powered_rows("csjd_pac_w64", p), powered_rows("csjd_official", 0.42, window=16)])
        on_map = regime.run_table(rows, powered).set_index("decoder")["audited_lossless"]
        on_goal = candidate_rows(rows, GOAL, powered).set_index("decoder")["audited_lossless"]
        assert on_map["csjd_pac_w64"] is expected and on_goal["csjd_pac_w64"] is expected
        assert on_map["csjd_official"] is True and on_goal["csjd_official"] is True
        assert all(on_map[d] == on_goal[d] or (on_map[d] is None and on_goal[d] is None) for d in on_goal.index)


def test_a_powered_audit_is_matched_by_settings_whatever_either_run_named_the_decoder():
    """An audit names its decoder as its overlay does (`csjd_pac` at window 64 there, `csjd_pac_w64` in the goal
    run): the settings that decide the samples match, the name does not count; other settings do not match."""
    from studies import regime

    renamed = powered_rows("csjd_pac_w64", 0.42, name="csjd_pac")
    text = section(run_rows(), renamed)
    assert "| 0.7 | 0.42 (458752; n/a: no hash) | True |" in text
    other = powered_rows("csjd_pac_w64", 0.42, name="csjd_pac")
    configs = json.loads(other["decoder_configs"].iloc[0])
    configs["csjd_pac"]["coupling"] = "gumbel"  # one setting that changes the samples
    assert "| 0.7 | - | unknown |" in section(run_rows(), other.assign(decoder_configs=json.dumps(configs)))
    drafter = {"weights": "sjd/assets/d", "record": {"weights_sha": "abc", "measured": {"top1": 0.1}}}
    remeasured = {"weights": "sjd/assets/d", "record": {"weights_sha": "abc", "measured": {"top1": 0.2}}}
    assert regime.sample_settings({"name": "a", "drafter": drafter}) == regime.sample_settings(
        {"name": "b", "drafter": remeasured})  # fmt: skip
    retrained = {"weights": "sjd/assets/d", "record": {"weights_sha": "abd"}}
    assert regime.sample_settings({"drafter": drafter}) != regime.sample_settings({"drafter": retrained})


def test_a_powered_audit_counts_only_for_the_same_weights():
    """Audits are matched to runs by the weights each decoded with: the hash of the networks a run loaded where
    both rows have it, else a stand-in's recorded weights hash, else the model's name (rows of released weights
    from before runs hashed them)."""
    from studies import regime

    loaded = {"weights_sha": json.dumps({"model": "aaaa", "csjd_pac_w64": "dddd"})}
    run = run_rows().iloc[0].to_dict() | loaded
    config = settings("csjd_pac_w64", 64)

    def audit_of(**columns) -> dict | None:
        return regime.powered_audit(powered_rows("csjd_pac_w64", 0.42).assign(**columns), run, "csjd_pac_w64", config)

    assert audit_of(**loaded) is not None and audit_of(**loaded)["weights_hashed"] is True
    assert audit_of(weights_sha=json.dumps({"model": "bbbb", "csjd_pac_w64": "dddd"})) is None  # other model weights
    assert audit_of(weights_sha=json.dumps({"model": "aaaa", "csjd_pac_w64": "eeee"})) is None  # another drafter
    assert audit_of(**loaded, model="standin_lumina_768_cal") is not None  # the weights decide, not the name
    # older rows: the stand-in's recorded hash where both have one, else the name
    recorded = {"model_training": json.dumps({"weights_sha": "d181"})}
    old_run = run_rows().iloc[0].to_dict() | recorded
    old = powered_rows("csjd_pac_w64", 0.42)
    by_record = regime.powered_audit(old.assign(**recorded), old_run, "csjd_pac_w64", config)
    assert by_record is not None and by_record["weights_hashed"] is False  # a page shows n/a: no hash beside it
    assert regime.powered_audit(old.assign(model_training=json.dumps({"weights_sha": "0000"})), old_run,
                                "csjd_pac_w64", config) is None  # fmt: skip
    assert regime.powered_audit(old.assign(**recorded, model="toy"), old_run, "csjd_pac_w64", config) is None


def test_the_targets_and_references_are_the_overlays(tmp_path):
    """The page decides what the overlay's study.goal states: another target gives another verdict, and a goal
    study without a goal block stops with its key."""
    import dataclasses

    from studies.overlays import read_goal

    assert GOAL.references == {16: "sjd_official", 64: "sjd_pac_official_w64"} and GOAL.targets == {16: 2.5, 64: 1.25}
    assert GOAL.latency_references(64) == ("sjd_pac_official_w64", "scd_official_w64")
    lower = dataclasses.replace(GOAL, targets={16: 1.5, 64: 1.25})
    text = "\n".join(goal_section(run_rows(), [COMMAND], pd.read_csv(PUBLISHED), lower))
    assert "Window 16: the best is `csjd_official` at 2.10 [" in text
    assert "the 1.5x target is met" in text and "2.5x" not in text
    with pytest.raises(ValueError, match=r"overlay\.yaml: study\.goal must name its references"):
        read_goal(None, "overlay.yaml: study")


def test_a_met_picked_among_candidates_stands_only_on_its_confirming_run():
    """A met by the best of several candidates is pending until the goal's confirming experiment decodes it again on
    fresh prompts and seeds; that run's interval is then the verdict, and it is not read as a run of its own."""
    rows = run_rows(spread=0.01)  # csjd_pac_w64 at 1.30 (1.29-1.31) x SJD-PAC: met in the selection run
    weaker = rows[rows["decoder"] == "csjd_pac_w64"].assign(decoder="csjd_gumbel_w64")
    for column in ("step_compression", "vs_sjd_official", "vs_sjd_pac_official_w64"):
        for end in ("", "_lo", "_hi"):
            weaker[f"{column}{end}"] *= 0.9
    weaker["n_forward"] /= 0.9
    configs = json.loads(rows["decoder_configs"].iloc[0]) | {"csjd_gumbel_w64": settings("csjd_gumbel_w64", 64)}
    lossless = json.loads(rows["decoder_lossless"].iloc[0]) | {"csjd_gumbel_w64": True}
    rows = pd.concat([rows, weaker], ignore_index=True).assign(
        decoder_configs=json.dumps(configs), decoder_lossless=json.dumps(lossless)
    )
    assert GOAL.confirming == "beyond_sjd_pac_confirm"
    confirm_command = "python run.py experiment=beyond_sjd_pac_confirm"
    commands = [COMMAND, confirm_command]
    text = "\n".join(goal_section(rows, commands, pd.read_csv(PUBLISHED), GOAL))
    assert "The 1.25x target is met over the model's whole range" in text
    assert "It was picked among 2 candidates by its point estimate, so the met is pending a confirming run" in text
    again = run_rows(run_dir="c1", spread=0.05).assign(command=confirm_command, experiment="beyond_sjd_pac_confirm")
    again = again[again["decoder"].isin(["ar", "sjd_official", "scd_official_w64", "sjd_pac_official_w64",
                                          "csjd_pac_w64"])].copy()  # fmt: skip
    pick = again["decoder"] == "csjd_pac_w64"
    again.loc[pick, "n_forward"] = 1000 / 4.0 / 1.10  # 1.10x SJD-PAC's forwards: 1.10x its latency at every corner
    again.loc[pick, ["modelled_vs_sjd_pac_official_w64_lo", "modelled_vs_sjd_pac_official_w64_hi"]] = [0.95, 1.05]
    text = "\n".join(goal_section(pd.concat([rows, again], ignore_index=True), commands, pd.read_csv(PUBLISHED), GOAL))
    assert (
        "It was picked among 2 candidates by its point estimate; in the confirming run of it alone beside the "
        "references on fresh prompts and seeds (`experiment=beyond_sjd_pac_confirm`) it is at 1.10 [1.04-1.16; eager "
        "1.10, compiled 1.10, graphed 1.10], and the target is missed over the model's whole range"
    ) in text
    assert text.count("### ") == 1  # the confirming run is read as a confirmation, not as a run of its own


def test_the_recorded_goal_run_lists_scd_beside_sjd_pac_and_reads_window_64_over_the_faster():
    """On the recorded 768 px goal run (results/studies/beyond_sjd_pac.csv): SCD's and SJD-PAC's rows lead the
    table, each candidate has a step compression over both, and the window-64 target is read in latency over the
    faster of the two, with its step compression shown beside it and what decided it."""
    command = "python run.py experiment=beyond_sjd_pac model=standin_lumina_768_cal prompts.n=8"
    results = pd.read_csv(ROOT / "results" / "studies" / "beyond_sjd_pac.csv", low_memory=False)
    text = "\n".join(goal_section(results, [command], pd.read_csv(PUBLISHED), GOAL))
    assert "| sjd_pac_official_w64 | reference | official | 64 |" in text
    assert "| scd_official_w64 | reference | official | 64 |" in text
    header = next(line for line in text.splitlines() if line.startswith("| decoder | role |"))
    assert "| over sjd_pac_official_w64 | over scd_official_w64 |" in header
    assert "| latency over the faster of sjd_pac_official_w64 and scd_official_w64 |" in header
    line = next(x for x in text.splitlines() if x.startswith("- Window 64:"))
    assert "times the latency of the faster of `sjd_pac_official_w64` and `scd_official_w64` (the faster is" in line
    assert "(shown, not decisive)" in line and "decided by the cost model over its range" in line
