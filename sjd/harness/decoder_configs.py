"""conf/decoder: one config per algorithm, and the named variants the study overlays use.

An *algorithm* config (conf/decoder/sjd.yaml, conf/decoder/csjd_pac.yaml) names its `_target_` and every
default. A *variant* (conf/decoder/sjd_harness.yaml, conf/decoder/sjd_pac_official_w64.yaml) is an algorithm
config with a few settings changed: its
defaults list names the algorithm config, then `_self_`. Hydra composes both alike (`decoder=<name>`, or
`- /decoder@named_decoders.<row>: <name>` in an overlay); `decoder_config` composes one outside Hydra the
same way, for tools and tests that read conf/decoder directly.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

DECODER_DIR = Path(__file__).resolve().parents[2] / "conf" / "decoder"


def decoder_config(name: str, directory: Path = DECODER_DIR) -> DictConfig:
    """conf/decoder/<name>.yaml with its defaults list applied (the configs it names, in order, then itself)."""
    path = directory / f"{name}.yaml"
    if not path.is_file():
        found = sorted(p.stem for p in directory.glob("*.yaml"))
        raise ValueError(f"no decoder config {name!r} in {directory} (there are {found})")
    raw = OmegaConf.load(path)
    defaults = raw.pop("defaults", None) or []
    if defaults and defaults[-1] != "_self_":
        raise ValueError(f"{path}: a decoder variant's defaults list ends with _self_, got {list(defaults)}")
    parts = [decoder_config(str(d), directory) for d in defaults if d != "_self_"]
    return OmegaConf.merge(*parts, raw) if parts else raw


def is_variant(name: str, directory: Path = DECODER_DIR) -> bool:
    """Whether conf/decoder/<name>.yaml is a variant (it starts from another config) rather than an algorithm's."""
    return "defaults" in OmegaConf.load(directory / f"{name}.yaml")


def algorithm_configs(directory: Path = DECODER_DIR) -> list[str]:
    """The algorithm configs: one per decoder file and its defaults. The decoder contract and the audits run these."""
    return sorted(p.stem for p in directory.glob("*.yaml") if not is_variant(p.stem, directory))


def variant_configs(directory: Path = DECODER_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml") if is_variant(p.stem, directory))
