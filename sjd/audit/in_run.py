"""The in-run exactness audit (`audit.n` > 0): is each decoder of the run distributed as AR?

After the benchmark, each decoder draws `audit.n` samples of one caption (`audit.prompt`, by
default the model's `audit_prompt`), and AR draws 2n. Each decoder's samples are tested against
AR's first n position by position (`sjd.audit.stats.marginal_test`: two-sample chi-square,
Bonferroni over positions; mean per-position TV distance), and AR's two halves against each other
give the noise floor of that distance. Every sample has its own generator, seeded from (seed, tag +
index), so the audit's samples do not depend on its batch size.
"""

from __future__ import annotations

import pandas as pd
from omegaconf import DictConfig

from sjd.audit.stats import draw_samples, marginal_test
from sjd.core.sampling import SamplingConfig
from sjd.decoders.ar import ARDecoder
from sjd.decoders.base import Decoder
from sjd.models.base import ModelAdapter

AUDIT_COLUMNS = ["audit_n", "audit_tv", "audit_p", "audit_noise_tv", "lossless_expected"]


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
    """One row per decoder: audit_n, audit_tv, audit_p, AR's noise floor audit_noise_tv, and whether the
    decoder claims to be lossless (lossless_expected)."""
    caption = audit_caption(cfg)
    n, batch = int(cfg.audit.n), int(cfg.audit.get("batch_size", 500))
    reference = draw_samples(ARDecoder(), adapter, sampling, caption, 2 * n, batch, cfg.seed, "r").cpu().numpy()
    noise = marginal_test(reference[:n], reference[n:])
    rows = []
    for d in decoders:
        samples = draw_samples(d, adapter, sampling, caption, n, batch, cfg.seed, "d").cpu().numpy()
        result = marginal_test(samples, reference[:n])
        rows.append(
            {
                "decoder": d.name,
                "audit_n": n,
                "audit_tv": result.tv_distance,
                "audit_p": result.p_value,
                "audit_noise_tv": noise.tv_distance,
                "lossless_expected": d.lossless,
            }
        )
    return pd.DataFrame(rows, columns=["decoder", *AUDIT_COLUMNS])
