"""Provenance that shows: a run's line names the hashes of the networks it loaded (`weights_sha`), and where a row
was written before runs hashed them, the page says `n/a: no hash`, as a missing interval says `n/a: rerun`; so does
every citation of an audit with power matched to a run by its weights."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from studies.goal_page import candidate_rows, verdict_columns
from studies.overlays import Goal
from studies.tables import NO_HASH, describe_run

LOADED = json.dumps({"eagle": "e007d910e6a0786a", "model": "712da65892e0edeb", "sjd": "712da65892e0edeb"})


def run_rows(weights_sha) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "decoder": ["ar", "sjd", "csjd"],
            "model": "standin_lumina_512_cal",
            "prompt_set": "standin",
            "prompt_selection": "first 4 of 168",
            "batch_size": 4,
            "device": "cpu",
            "git_hash": "abc",
            "weights_sha": weights_sha,
        }
    )


def test_a_run_names_the_weights_it_loaded_or_says_it_has_no_hash():
    line = describe_run(run_rows(LOADED))
    assert "weights `712da65892e0edeb` (model, sjd), `e007d910e6a0786a` (eagle);" in line  # the model's first
    assert f"weights {NO_HASH};" in describe_run(run_rows(np.nan)) and NO_HASH == "n/a: no hash"
    assert f"weights {NO_HASH};" in describe_run(run_rows(np.nan).drop(columns="weights_sha"))


def test_an_audit_with_power_matched_without_hashes_is_cited_with_no_hash():
    """The goal and drafters tables cite a powered audit's p; where the match of weights rests on a weaker identity
    than both runs' hashes, the cell says so."""
    goal = Goal(references={16: "sjd"}, targets={})
    configs = json.dumps({"ar": {}, "sjd": {"window": 16}, "csjd": {"window": 16, "coupling": "maximal"}})
    run = run_rows(LOADED).assign(decoder_configs=configs, decoder_lossless=json.dumps(dict.fromkeys(["ar", "sjd",
                                  "csjd"], True)), tf_p=0.5, tf_control_p=0.5, tf_n_tokens=100, tf_tokens_needed=1e6,
                                  sampling="s")  # fmt: skip
    audit = pd.DataFrame({"decoder": ["ar", "csjd"], "model": "standin_lumina_512_cal", "tf_p": [0.5, 0.3],
                          "tf_control_p": 0.5, "tf_n_tokens": 500_000, "tf_tokens_needed": 400_000.0,
                          "decoder_configs": configs, "experiment": "audit_powered", "sampling": "s"})  # fmt: skip
    hashed = verdict_columns(candidate_rows(run, goal, audit.assign(weights_sha=LOADED)))
    assert hashed["powered audit p (tokens)"] == ["0.3 (500000)"]
    unhashed = verdict_columns(candidate_rows(run, goal, audit))
    assert unhashed["powered audit p (tokens)"] == ["0.3 (500000; n/a: no hash)"]
    assert unhashed["audited_lossless"] == hashed["audited_lossless"] == ["True"]  # the match stands, marked
