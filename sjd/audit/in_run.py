"""The in-run exactness audit (`audit.n` > 0): is each decoder of the run distributed as AR?

After the benchmark, each decoder draws `audit.n` samples of one caption (`audit.prompt`, by
default the model's `audit_prompt`), and AR draws 2n (sjd.audit.driver, shared with scripts/audit.py).
Each decoder's samples are tested against AR's first n position by position
(`sjd.audit.stats.marginal_test`: two-sample chi-square, Bonferroni over positions; mean per-position
TV distance), and AR's two halves against each other give the noise floor of that distance.

`audit.teacher_forced` adds the one-sample audit (sjd.audit.teacher_forced) of the run's own samples:
one teacher-forced forward per image, at the run's dtype and through the adapter's own path. AR's
samples go through the same test as the control; when AR fails, the teacher-forced forward and the
decoding forwards disagree numerically (bf16 window forwards against one full-sequence forward, for
example), and every row's verdict says so rather than blaming the decoder.
A decoder that commits blocks of rows records which row of its block committed each token
(`extras["block_depth"]`, sjd.decoders.ssd), and the audit splits its impossible tokens by it.
Every sample has its own generator, seeded from (seed, tag + index), so the audit's samples do not
depend on its batch size.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig

from sjd.audit.driver import AuditDraws
from sjd.audit.teacher_forced import ALPHA, TF_COLUMNS, audit_images
from sjd.core.sampling import SamplingConfig
from sjd.decoders.base import Decoder
from sjd.models.base import ModelAdapter
from sjd.types import Prompt

AUDIT_COLUMNS = ["audit_n", "audit_positions", "audit_tv", "audit_p", "audit_noise_tv", "lossless_expected"]


def audit_caption(cfg: DictConfig) -> str | None:
    """The caption the audit samples, or None when the audit is off. Fails early on bad settings."""
    audit = cfg.get("audit") or {}
    n = audit.get("n", 0) or 0
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"audit.n must be an integer >= 0 (0 = no audit), got {n!r}")
    if n == 0:
        return None
    batch = audit.get("batch_size", 500)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"audit.batch_size must be an integer >= 1, got {batch!r}")
    caption = audit.get("prompt") or cfg.model.get("audit_prompt")
    if not caption:
        raise ValueError(
            f"audit.n={n} needs a caption: set audit.prompt, or audit_prompt in conf/model/{cfg.model.name}.yaml"
        )
    return str(caption)


def audit_decoders(
    cfg: DictConfig, adapter: ModelAdapter, decoders: list[Decoder], sampling: SamplingConfig
) -> pd.DataFrame:
    """One row per decoder: audit_n, the positions tested (audit_positions), audit_tv, audit_p (NaN when
    no position was testable), AR's noise floor audit_noise_tv, and whether the decoder claims to be
    lossless (lossless_expected)."""
    caption = audit_caption(cfg)
    n, batch = int(cfg.audit.n), int(cfg.audit.get("batch_size", 500))
    draws = AuditDraws(adapter, sampling, caption, n, batch, cfg.seed)
    rows = []
    for d in decoders:
        result, noise = draws.two_sample(draws.draw(d))
        rows.append(
            {
                "decoder": d.name,
                "audit_n": n,
                "audit_positions": result.n_tested,
                "audit_tv": result.tv_distance,
                "audit_p": result.p_value,
                "audit_noise_tv": noise.tv_distance,
                "lossless_expected": d.lossless,
            }
        )
    return pd.DataFrame(rows, columns=["decoder", *AUDIT_COLUMNS])


# -- the one-sample teacher-forced audit of the run's own samples (audit.teacher_forced) ----------
TF_RUN_COLUMNS = [*TF_COLUMNS, "tf_control_p", "tf_verdict"]


def teacher_forced_batch(cfg: DictConfig) -> int | None:
    """Images per teacher-forced forward when `audit.teacher_forced` is on, else None. Fails at start-up,
    naming the key, on a setting the audit cannot serve."""
    audit = cfg.get("audit") or {}
    on = audit.get("teacher_forced", False)
    if not isinstance(on, bool):
        raise ValueError(f"audit.teacher_forced must be true or false, got {on!r}")
    if not on:
        return None
    batch = audit.get("teacher_forced_batch", 8)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"audit.teacher_forced_batch must be an integer >= 1, got {batch!r}")
    baseline = cfg.get("baseline")
    if baseline is None or baseline.get("_target_") != "sjd.decoders.ar.ARDecoder":
        raise ValueError("audit.teacher_forced=true needs baseline=ar: AR's samples are the audit's control")
    if cfg.model.sampling.get("temperature", 1.0) == 0:
        raise ValueError(
            "audit.teacher_forced=true needs random samples, but model.sampling.temperature=0 (greedy) gives "
            "samples that carry no randomness to test"
        )
    return batch


def verdict(row: dict, control_p: float, lossless: bool) -> str:
    """pass / fail / paths disagree / no power / untested, for one decoder's tf_* numbers."""
    if not np.isfinite(row["tf_p"]):
        return "untested"
    if not np.isfinite(control_p) or control_p <= ALPHA:
        return "paths disagree (AR fails)"  # teacher forcing and decoding differ numerically
    if row["tf_p"] <= ALPHA:
        return "fail" if lossless else "differs (lossy)"
    return "no power" if row["tf_n_tokens"] < row["tf_tokens_needed"] else "pass"


def block_depths(samples: pd.DataFrame) -> np.ndarray | None:
    """[n, N] the row of its block that committed each token of each sample (`extras["block_depth"]`, recorded by
    a decoder that commits blocks of rows, sjd.decoders.ssd); None unless every sample has it."""
    extras = [e if isinstance(e, dict) else {} for e in samples.get("extras", [])]
    if not extras or any("block_depth" not in e for e in extras):
        return None
    return np.array([e["block_depth"] for e in extras], dtype=np.int64)


def teacher_forced_rows(
    cfg: DictConfig, adapter: ModelAdapter, samples: pd.DataFrame, decoders: list[Decoder], sampling: SamplingConfig
) -> pd.DataFrame:
    """One row per decoder: the tf_* numbers of its samples in samples.jsonl, AR's tf_p as tf_control_p,
    and the verdict. AR (the baseline) goes through the same test."""
    batch = teacher_forced_batch(cfg)
    found = {}
    for d in decoders:
        mine = samples[samples["decoder"] == d.name]
        prompts = [Prompt(str(i), t) for i, t in zip(mine["prompt_id"], mine["prompt"])]
        tokens = torch.tensor(np.stack(mine["tokens"].to_numpy()))
        seeds = [int(s) for s in mine["seed"]]
        found[d.name] = audit_images(adapter, prompts, tokens, seeds, sampling, batch, block_depths(mine))
    control_p = found[cfg.baseline.name]["tf_p"]
    rows = []
    for d in decoders:
        row = {**found[d.name], "tf_control_p": control_p}
        # AR, the control, under the decoders' rule: a pass needs the tokens that give the test power too
        row["tf_verdict"] = verdict(row, control_p, d.lossless) if d.name != cfg.baseline.name else (
            "paths disagree" if control_p <= ALPHA else verdict(row, control_p, True))  # fmt: skip
        rows.append({"decoder": d.name, **row})
    return pd.DataFrame(rows, columns=["decoder", *TF_RUN_COLUMNS])


def with_teacher_forced_audit(
    cfg: DictConfig, summary: pd.DataFrame, samples: pd.DataFrame, adapter: ModelAdapter, decoders, sampling
) -> pd.DataFrame:
    """The summary with the tf_* columns when `audit.teacher_forced` is on (else unchanged)."""
    if teacher_forced_batch(cfg) is None:
        return summary
    return summary.merge(teacher_forced_rows(cfg, adapter, samples, decoders, sampling), on="decoder", how="left")
