"""Image quality of a run, per decoder: FID and CLIP score under the run's `eval` config.

Images are decoded from the tokens in samples.jsonl, so quality is measured on exactly what
was generated (and a finished run can be re-scored). Each row records the protocol, the
feature network and the reference statistics it used, so numbers from different protocols
never land in one column unlabelled.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from sjd.eval.clip_score import check_clip_weights, clip_model_label, clip_score
from sjd.eval.fid import add_images, build_metric, load_reference, reference_key, save_reference, toy_reference_images
from sjd.models.base import ModelAdapter

QUALITY_COLUMNS = ["fid", "fid_protocol", "fid_extractor", "fid_reference", "clip", "clip_protocol", "clip_model"]


def check_eval(eval_cfg) -> dict | None:
    """Resolve the run's eval config and fail before any model is loaded if a file it names is
    missing (errors name the config key)."""
    if eval_cfg is None:
        return None
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    try:
        cfg = OmegaConf.to_container(eval_cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:
        raise ValueError(f"eval={eval_cfg.get('name')}: set `eval.{e.full_key}` (it has no default)") from e
    fid = cfg.get("fid")
    if fid:
        if fid["reference"] != "toy_heldout" and not Path(fid["reference"]).is_file():
            raise FileNotFoundError(f"eval.fid.reference: {fid['reference']} not found (make it with "
                                    "scripts/fid_reference.py)")  # fmt: skip
        if fid["extractor"] == "inception" and not Path(str(fid.get("inception_weights"))).is_file():
            raise FileNotFoundError(f"eval.fid.inception_weights: {fid.get('inception_weights')} not found")
    if cfg.get("clip"):
        check_clip_weights(cfg["clip"])
    return cfg


def decode_all(adapter: ModelAdapter, tokens: list[list[int]], batch: int = 64) -> np.ndarray:
    t = torch.tensor(tokens, dtype=torch.long)
    return np.concatenate([adapter.decode_images(t[i : i + batch]) for i in range(0, len(t), batch)])


def fid_metric(fid_cfg: dict):
    """The FID metric an eval config asks for (`require_reference_inception` only matters for inception)."""
    return build_metric(
        fid_cfg["extractor"],
        fid_cfg.get("weights"),
        fid_cfg.get("inception_weights"),
        bool(fid_cfg.get("require_reference_inception", True)),
    )


def reference_path(fid_cfg: dict, cache_dir: Path) -> Path:
    """The .npz of real-image statistics; `toy_heldout` is computed on first use and cached."""
    if fid_cfg["reference"] != "toy_heldout":
        return Path(fid_cfg["reference"])
    n = int(fid_cfg.get("reference_n") or 2000)
    key = reference_key(fid_cfg["extractor"], fid_cfg["protocol"], f"toy_heldout:{n}:{fid_cfg.get('weights')}")
    path = cache_dir / "fid_reference" / f"toy_heldout_{key}.npz"
    if not path.is_file():
        metric = fid_metric(fid_cfg)
        add_images(metric, toy_reference_images(n), fid_cfg["protocol"], real=True)
        note = {
            "source": "toy held-out scenes",
            "n": n,
            "extractor": fid_cfg["extractor"],
            "protocol": fid_cfg["protocol"],
        }
        save_reference(metric, path, note)
    return path


def evaluate(eval_cfg: dict | None, samples: pd.DataFrame, adapter: ModelAdapter, cache_dir: Path) -> pd.DataFrame:
    """One row per decoder with the QUALITY_COLUMNS; empty when the run has no eval config."""
    if not eval_cfg or (not eval_cfg.get("fid") and not eval_cfg.get("clip")):
        return pd.DataFrame(columns=["decoder", *QUALITY_COLUMNS])
    fid_cfg, clip_cfg = eval_cfg.get("fid"), eval_cfg.get("clip")
    metric = None
    if fid_cfg:
        ref = reference_path(fid_cfg, cache_dir)
        metric = fid_metric(fid_cfg)
        load_reference(metric, ref)
    rows = []
    for decoder, df in samples.groupby("decoder", sort=False):
        images = decode_all(adapter, df["tokens"].tolist())
        row = {"decoder": decoder}
        if metric is not None:
            metric.reset()  # keeps the real statistics (reset_real_features=False)
            add_images(metric, images, fid_cfg["protocol"], real=False)
            fid = float(metric.compute()) if len(images) > 1 else float("nan")
            row.update(fid=fid, fid_protocol=fid_cfg["protocol"], fid_extractor=fid_cfg["extractor"])
            row["fid_reference"] = str(ref)
        if clip_cfg:
            row.update(
                clip=clip_score(images, df["prompt"].tolist(), clip_cfg["backend"], clip_cfg.get("model"),
                                clip_cfg["protocol"], clip_cfg.get("prefix", ""), clip_cfg.get("scale", 1.0),
                                pretrained=clip_cfg.get("pretrained")),
                clip_protocol=clip_cfg["protocol"], clip_model=clip_model_label(clip_cfg),
            )  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)
