"""Exactness audit of a decoder: `python scripts/audit.py decoder=NAME [options]`.

Prints, as its last line, one JSON object with decoder, n_samples, tv_distance, p_value,
lossless_expected (and the same numbers for AR as a noise floor). A lossless decoder should
show a p-value that is not small and a TV distance at AR's noise level.
"""

from __future__ import annotations

import json
import time

import hydra
import numpy as np
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from sjd.audit.stats import (
    draw_samples,
    enumerate_images,
    exact_test,
    marginal_test,
    outcome_index,
    sequence_probabilities,
)
from sjd.core.sampling import SamplingConfig
from sjd.decoders.ar import ARDecoder
from sjd.harness.config import register_resolvers
from sjd.types import Prompt

register_resolvers()


def audit(cfg: DictConfig) -> dict:
    if cfg.model.get("enumerable", False):
        with open_dict(cfg):
            for key, value in (cfg.micro_decoder or {}).items():
                if key in cfg.decoder and value is not None:
                    cfg.decoder[key] = value
    sampling = SamplingConfig(**OmegaConf.to_container(cfg.model.sampling))
    decoder = instantiate(cfg.decoder)
    adapter = instantiate(cfg.model.adapter, device=cfg.device)
    decoder.check(adapter)
    t0 = time.perf_counter()
    samples = draw_samples(decoder, adapter, sampling, cfg.prompt, cfg.n_samples, cfg.batch_size, cfg.seed, "d")
    reference = draw_samples(ARDecoder(), adapter, sampling, cfg.prompt, cfg.n_samples, cfg.batch_size, cfg.seed, "r")
    report = {
        "decoder": decoder.name,
        "decoder_config": decoder.config(),
        "model": adapter.name,
        "n_samples": cfg.n_samples,
        "sampling": sampling.__dict__,
    }
    if cfg.model.get("enumerable", False):
        space = enumerate_images(adapter)
        probs = sequence_probabilities(adapter, Prompt("p", cfg.prompt), space, sampling).numpy()
        n = len(space)
        dec = exact_test(np.bincount(outcome_index(samples, space), minlength=n), probs)
        ref = exact_test(np.bincount(outcome_index(reference, space), minlength=n), probs)
        report.update(test="exact chi-square vs enumerated AR distribution", n_outcomes=n)
    else:
        dec = marginal_test(samples.numpy(), reference.numpy())
        half = cfg.n_samples // 2  # AR against itself: the noise floor of the same test
        ref = marginal_test(reference[:half].numpy(), reference[half:].numpy())
        report.update(test="per-position two-sample chi-square vs AR samples, Bonferroni")
    report.update(
        tv_distance=round(dec.tv_distance, 6),
        p_value=dec.p_value,
        dof=dec.dof,
        ar_tv_distance=round(ref.tv_distance, 6),
        ar_p_value=ref.p_value,
        lossless_expected=bool(decoder.lossless),
        seconds=round(time.perf_counter() - t0, 1),
    )
    return report


@hydra.main(version_base="1.3", config_path="../conf", config_name="audit")
def main(cfg: DictConfig) -> None:
    print(json.dumps(audit(cfg)))


if __name__ == "__main__":
    main()
