"""The shadow a run's config names (conf/shadow/): checked, built beside the model, and recorded.

`shadow=<name>` times a real architecture with random weights (sjd/models/real_architectures.py) beside the model
the run decodes with: every forward is made on both, the decoder decides on the model's logits, and the latency
columns time the shadow's forwards (sjd/models/shadow.py; docs/evaluation.md, "Shadow timing"). The samples are the
model's, so the shadow is not part of the config fingerprint; every results row names it (`shadow`,
`shadow_params`, `shadow_layers`, `shadow_settings`), and a run directory is resumed only with the shadow that
timed its samples.

Checks, each naming its key: the settings' types and values with the rest of the config (`shadow_problems`, before
anything loads); then, before the real-size build, whether the shadow's stream holds the model's (a tiny build of
the same architecture gives its layout in well under a second) and whether it can follow every call the run's
decoders make.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from sjd.decoders.base import Decoder
from sjd.harness.results import sample_files
from sjd.models.base import ModelAdapter
from sjd.models.real_architectures import BUILDERS, MODELS, Built
from sjd.models.shadow import ShadowedAdapter, fits
from sjd.types import CUSTOM_MASK, EMBEDS, FEATURES, WINDOW

ROOT = Path(__file__).resolve().parents[2]
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# What the shadow must provide to follow a decoder that requires a capability: the calls it then makes.
FOLLOWS = {WINDOW: WINDOW, CUSTOM_MASK: CUSTOM_MASK, FEATURES: FEATURES, EMBEDS: WINDOW}


@dataclass(frozen=True)
class ShadowSettings:
    """conf/shadow/<name>.yaml."""

    name: str | None = None  # a real architecture (sjd.models.real_architectures.MODELS); null: no shadow
    layers: int | None = None  # its depth cut to this many layers, the widths kept; null: the real depth
    tiny: bool = False  # the architecture's tiny widths and depth (tests); layers still cuts the depth
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on the CPU
    seed: int = 0  # the random weights' seed
    resolution: int | None = None  # pixels; null: the real model's config's (conf/model/<name>.yaml)


def shadow_problems(values: Mapping) -> list[str]:
    """What is wrong with the `shadow` config node, each naming its key (sjd.harness.config_check)."""
    from sjd.harness.config_check import check_settings

    problems = check_settings("shadow", values, ShadowSettings)
    if problems:
        return problems
    s = ShadowSettings(**values)
    if s.name is None:  # settings of no shadow are a mistake: say so rather than ignore them
        chosen = [f"shadow.{k}={v!r}" for k, v in asdict(s).items() if v != asdict(ShadowSettings())[k]]
        if chosen:
            problems.append(f"{', '.join(chosen)}: no shadow is chosen (shadow=none); name one with shadow=<name>")
        return problems
    if s.name not in MODELS:
        problems.append(f"shadow.name={s.name!r}: not a real architecture; one of {list(MODELS)} (or shadow=none)")
    if s.layers is not None and s.layers < 1:
        problems.append(f"shadow.layers={s.layers}: must be >= 1, or null for the real depth")
    if s.dtype not in DTYPES:
        problems.append(f"shadow.dtype={s.dtype!r}: one of {list(DTYPES)}")
    if s.resolution is not None and s.resolution < 1:
        problems.append(f"shadow.resolution={s.resolution}: must be >= 1 pixels, or null for the real model's")
    return problems


def settings_of(cfg: DictConfig) -> ShadowSettings | None:
    """The run's shadow settings, None for none (shadow=none, or a config without the group)."""
    node = cfg.get("shadow")
    if node is None:
        return None
    settings = ShadowSettings(**OmegaConf.to_container(node, resolve=True))
    return settings if settings.name is not None else None


def real_resolution(name: str) -> int:
    """The resolution the real model's config sets (conf/model/<name>.yaml; Janus-Pro's is fixed at 384)."""
    return int(OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml").adapter.get("resolution", 384))


def build_architecture(settings: ShadowSettings, tiny: bool, device: torch.device, dtype: torch.dtype) -> Built:
    """The shadow's architecture with its seeded random weights; the global random state is left as it was."""
    resolution = settings.resolution or real_resolution(settings.name)
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(settings.seed)
        try:
            return BUILDERS[settings.name](tiny, device, dtype, resolution, settings.layers)
        except ValueError as e:  # a resolution the architecture cannot take
            raise ValueError(f"shadow.resolution={resolution} (shadow={settings.name}): {e}") from None


def check_follows(settings: ShadowSettings, model: ModelAdapter, decoders: Sequence[Decoder]) -> None:
    """Refuse, before the real-size build, a shadow whose stream is shorter than the model's or that lacks a call
    one of the decoders makes. A tiny build of the same architecture on the CPU has the same layout and calls."""
    probe = build_architecture(settings, True, torch.device("cpu"), torch.float32).adapter
    resolution = settings.resolution or real_resolution(settings.name)
    if not fits(model.layout, probe.layout):
        raise ValueError(
            f"shadow={settings.name} cannot follow model {model.name!r}: at {resolution} px (shadow.resolution) it "
            f"generates {probe.layout.n_tokens} positions, the model {model.layout.n_tokens}; raise "
            "shadow.resolution or choose another shadow"
        )
    for d in decoders:
        missing = sorted({FOLLOWS[c] for c in d.requires if c in FOLLOWS} - probe.capabilities)
        if missing:
            raise ValueError(
                f"shadow={settings.name} cannot follow decoder {d.name!r}: it lacks the model capabilities {missing}"
            )


def with_shadow(cfg: DictConfig, model: ModelAdapter, decoders: Sequence[Decoder]) -> ModelAdapter:
    """The model as the run's decoders use it: itself, or with the shadow the config names beside it."""
    settings = settings_of(cfg)
    if settings is None:
        return model
    check_follows(settings, model, decoders)
    device = torch.device(model.device)
    dtype = DTYPES[settings.dtype] or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    built = build_architecture(settings, settings.tiny, device, dtype)
    record = {
        "shadow": settings.name,
        "shadow_params": built.params,
        "shadow_layers": depth(built.adapter),
        "shadow_settings": {**asdict(settings), "dtype": str(dtype).removeprefix("torch."), "note": built.note},
    }
    return ShadowedAdapter(model, built.adapter, record)


def depth(adapter: ModelAdapter) -> int:
    """Decoder layers of a real architecture's language model (LlamaGen's GPT calls them n_layer)."""
    arch = adapter.architecture()
    if "num_hidden_layers" in arch:
        return int(arch["num_hidden_layers"])
    return int(adapter.gpt.config.n_layer)


def shadow_record(adapter: ModelAdapter) -> dict:
    """What a run records of its shadow (meta.json and every summary row): `shadow` None for none."""
    return dict(adapter.record) if isinstance(adapter, ShadowedAdapter) else {"shadow": None}


def unshadowed(adapter: ModelAdapter) -> ModelAdapter:
    """The model without its shadow: for work whose time no row reports (audits, image scores)."""
    return adapter.standin if isinstance(adapter, ShadowedAdapter) else adapter


def check_same_shadow(run_dir: Path, record: dict) -> None:
    """Resume only with the shadow that timed the directory's samples: the samples would be the same with another
    (the fingerprint does not hold the shadow), but a summary row would mix latencies of two shadows."""
    meta_file = run_dir / "meta.json"
    if not sample_files(run_dir) or not meta_file.is_file():
        return
    meta = json.loads(meta_file.read_text())
    before = {k: meta.get(k) for k in record}
    if before != record:
        raise ValueError(
            f"{run_dir} holds samples timed with shadow {before} and this run times with {record}; a summary row "
            "would mix their latencies. Resume with the same shadow settings, or start another hydra.run.dir=..."
        )
