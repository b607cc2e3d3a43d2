"""Run an experiment and audit each of its decoders against AR of the same model (toy scale).

Used by the tables that put speed, quality and exactness side by side (scripts/toy_table.py,
scripts/beyond_sjd.py): one run gives steps, step compression, latency speedup, FID and CLIP
per decoder; then `n` samples of one caption per decoder are tested against AR's position by
position (two-sample chi-square, Bonferroni; mean per-position TV distance), with AR against
AR (two halves) as the noise floor.
"""

from __future__ import annotations

from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from sjd.audit.stats import draw_samples, marginal_test
from sjd.core.sampling import SamplingConfig
from sjd.decoders.ar import ARDecoder
from sjd.harness.runner import build_decoders, run

SETTINGS = (
    "window",
    "init",
    "context",
    "denoise_steps",
    "coupling",
    "forced_drafts",
    "verification",
    "neighbours",
    "delta",
    "branches",
    "branch_depth",
)
AUDIT_BATCH = 500


def run_and_audit(cfg: DictConfig, run_dir: Path, n: int, settings: tuple[str, ...] = SETTINGS) -> list[dict]:
    summary = run(cfg, run_dir).set_index("decoder")
    sampling = SamplingConfig(**OmegaConf.to_container(cfg.model.sampling))
    adapter = instantiate(cfg.model.adapter, device="cpu")
    caption = cfg.model.audit_prompt
    reference = draw_samples(ARDecoder(), adapter, sampling, caption, 2 * n, AUDIT_BATCH, cfg.seed, "r").numpy()
    noise = marginal_test(reference[:n], reference[n:])
    rows = []
    decoders, _ = build_decoders(cfg)
    for d in decoders:
        d.check(adapter)
        samples = draw_samples(d, adapter, sampling, caption, n, AUDIT_BATCH, cfg.seed, "d").numpy()
        audit = marginal_test(samples, reference[:n])
        s = summary.loc[d.name]
        described = ", ".join(f"{k}={v}" for k, v in d.config().items() if k in settings)
        rows.append(
            {
                "model": cfg.model.name,
                "prompts": s["prompt_selection"],
                "decoder": d.name,
                "settings": described or "-",
                "steps": s["n_forward"],
                "step_compression": s["step_compression"],
                "latency_s": s["latency_s"],
                "latency_speedup": s["latency_speedup"],
                "forward_cost": s["forward_cost"],  # measured in the run (sjd.harness.results.forward_efficiency)
                "efficiency_run": s["efficiency"],
                "fid": s.get("fid", float("nan")),
                "clip": s.get("clip", float("nan")),
                "audit_tv": audit.tv_distance,
                "audit_p": audit.p_value,
                "ar_noise_tv": noise.tv_distance,
                "lossless_expected": d.lossless,
            }
        )
    return rows
