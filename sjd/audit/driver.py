"""The audit driver that `scripts/audit.py` and the in-run audit share.

Both draw n samples of one caption with the decoder and 2n with AR (each sample with its own
generator, seeded from (seed, tag + index)); the decoder is tested against AR's first n, and AR's
two halves against each other give the test's noise floor at the same size. On an enumerable model
the decoder and AR's first n are tested against the exact distribution instead, so AR draws only n.
Each decoder's samples also get the one-sample teacher-forced audit (sjd.audit.teacher_forced), seeded
from the same seeds. AR's draws and audit depend only on the model, caption, sizes and seed, so
callers that audit many decoders may keep them across reports (`audit_report(cfg, shared)`).
"""

from __future__ import annotations

import json

import numpy as np
import torch

from sjd.audit.stats import (
    AuditResult,
    draw_samples,
    enumerate_images,
    exact_test,
    marginal_test,
    outcome_index,
    sequence_probabilities,
)
from sjd.audit.teacher_forced import audit_images
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import prompt_seed
from sjd.decoders.ar import ARDecoder
from sjd.decoders.base import Decoder
from sjd.models.base import ModelAdapter
from sjd.types import Prompt


class AuditDraws:
    """AR's 2n reference samples of one caption, drawn once and shared by every decoder audited."""

    def __init__(
        self,
        adapter: ModelAdapter,
        sampling: SamplingConfig,
        caption: str,
        n: int,
        batch: int,
        seed: int,
        reference_size: int | None = None,
        reference: torch.Tensor | None = None,
    ) -> None:
        self.adapter, self.sampling, self.caption = adapter, sampling, caption
        self.n, self.batch, self.seed = n, batch, seed
        self.reference_size = reference_size or 2 * n
        self._reference = reference  # AR's samples drawn earlier by the same settings, if the caller kept them

    @property
    def reference(self) -> torch.Tensor:
        """AR's reference_size samples (tag r; 2n by default), drawn on first use: the one-sample audit of a
        decoder needs none."""
        if self._reference is None:
            ar = ARDecoder()
            self._reference = draw_samples(ar, self.adapter, self.sampling, self.caption, self.reference_size,
                                           self.batch, self.seed, "r").cpu()  # fmt: skip
        return self._reference

    def draw(self, decoder: Decoder) -> torch.Tensor:
        return draw_samples(decoder, self.adapter, self.sampling, self.caption, self.n, self.batch, self.seed, "d")

    def two_sample(self, samples: torch.Tensor) -> tuple[AuditResult, AuditResult]:
        """(the decoder against AR's first n, AR's first n against its second n: the noise floor)."""
        ref = self.reference.numpy()
        return marginal_test(samples.cpu().numpy(), ref[: self.n]), marginal_test(ref[: self.n], ref[self.n :])

    def exact(self, samples: torch.Tensor) -> tuple[AuditResult, AuditResult]:
        """On an enumerable model: the decoder's and AR's first n against the exact AR distribution."""
        space = enumerate_images(self.adapter)
        probs = sequence_probabilities(self.adapter, Prompt("p", self.caption), space, self.sampling).numpy()
        k = len(space)
        dec = exact_test(np.bincount(outcome_index(samples.cpu(), space), minlength=k), probs)
        ref = exact_test(np.bincount(outcome_index(self.reference[: self.n], space), minlength=k), probs)
        return dec, ref

    def one_sample(self, samples: torch.Tensor, tag: str = "d") -> dict:
        """The teacher-forced audit of samples drawn by `draw` (tag d) or of AR's reference (tag r)."""
        ids = [f"{tag}{i}" for i in range(len(samples))]
        seeds = [prompt_seed(self.seed, i) for i in ids]
        prompts = [Prompt(i, self.caption) for i in ids]
        return audit_images(self.adapter, prompts, samples, seeds, self.sampling, self.batch)


def reference_key(cfg) -> str:
    """Everything AR's reference draws and their audit depend on: the model's config, the caption, the sizes,
    the seed, the device and whether the one-sample audit runs."""
    from omegaconf import OmegaConf

    keys = ("prompt", "n_samples", "batch_size", "seed", "device", "teacher_forced")
    return json.dumps({"model": OmegaConf.to_container(cfg.model, resolve=True), **{k: cfg.get(k) for k in keys}},
                      sort_keys=True, default=str)  # fmt: skip


def audit_report(cfg, shared: dict | None = None) -> dict:
    """The report of `python scripts/audit.py` for its composed config (conf/audit.yaml + overrides). `shared`,
    a dict kept across calls, keeps AR's reference draws and their one-sample audit by reference_key, so that
    auditing many decoders on one model draws AR once: the same samples and p as drawing it each time."""
    import time

    from hydra.utils import instantiate
    from omegaconf import OmegaConf, open_dict

    enumerable = bool(cfg.model.get("enumerable", False))
    if enumerable:
        with open_dict(cfg):
            for key, value in (cfg.micro_decoder or {}).items():
                if key in cfg.decoder and value is not None:
                    cfg.decoder[key] = value
    sampling = SamplingConfig(**OmegaConf.to_container(cfg.model.sampling))
    decoder = instantiate(cfg.decoder)
    adapter = instantiate(cfg.model.adapter, device=cfg.device)
    decoder.check(adapter)
    t0 = time.perf_counter()
    key = reference_key(cfg)
    kept = (shared or {}).get(key, {})
    reference_size = cfg.n_samples if enumerable else 2 * cfg.n_samples  # the exact test needs no noise floor
    draws = AuditDraws(adapter, sampling, cfg.prompt, cfg.n_samples, cfg.batch_size, cfg.seed, reference_size,
                       kept.get("reference"))  # fmt: skip
    samples = draws.draw(decoder)
    report = {"decoder": decoder.name, "decoder_config": decoder.config(), "model": adapter.name,
              "n_samples": cfg.n_samples, "sampling": sampling.__dict__}  # fmt: skip
    if enumerable:
        dec, ref = draws.exact(samples)
        report.update(test="exact chi-square vs enumerated AR distribution", n_outcomes=dec.n_tested)
    else:
        dec, ref = draws.two_sample(samples)
        report.update(test="per-position two-sample chi-square vs AR samples, Bonferroni", n_positions=dec.n_tested)
    report.update(tv_distance=round(dec.tv_distance, 6), p_value=dec.p_value, dof=dec.dof,
                  ar_tv_distance=round(ref.tv_distance, 6), ar_p_value=ref.p_value)  # fmt: skip
    if cfg.get("teacher_forced", True):
        report.update(draws.one_sample(samples))
        if "ar_tf_p" not in kept:
            kept["ar_tf_p"] = draws.one_sample(draws.reference[: cfg.n_samples], "r")["tf_p"]
        report["ar_tf_p"] = kept["ar_tf_p"]
    if shared is not None:
        shared[key] = kept | {"reference": draws.reference}
    report.update(lossless_expected=bool(decoder.lossless), seconds=round(time.perf_counter() - t0, 1))
    return report
