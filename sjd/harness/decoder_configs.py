"""conf/decoder: one config per algorithm, the variants several studies share, and an overlay's rows as they run.

An *algorithm* config (conf/decoder/sjd.yaml, conf/decoder/csjd_pac.yaml) names its `_target_` and every
default. A *variant* (conf/decoder/sjd_pac_official_w64.yaml) is an algorithm config with a few settings changed:
its defaults list names the algorithm config, then `_self_`. Hydra composes both alike (`decoder=<name>`, or
`- /decoder@named_decoders.<row>: <name>` in an overlay); `decoder_config` composes one outside Hydra the
same way, for tools and tests that read conf/decoder directly.

An overlay's rows (`named_decoders`) are settled once composed (`settle_named_rows`): each is named by its row, so a
variant that would only rename its algorithm needs no file, and with `named_window` set every row of the window
family runs at it (an overlay sets `named_window: ${decoder.window}` once, and its rows follow the window its
commands give).
"""

from __future__ import annotations

import re
from pathlib import Path

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict

from sjd.decoders.window import WindowSettings

DECODER_DIR = Path(__file__).resolve().parents[2] / "conf" / "decoder"
_TOP_LEVEL_DEFAULTS = re.compile(r"^defaults\s*:", re.M)


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
    """Whether conf/decoder/<name>.yaml is a variant (it starts from another config) rather than an algorithm's: it
    has a top-level `defaults` key. Read as text: tools and tests ask this of every config, and parsing each file
    in full cost the test suite's collection seconds."""
    return _TOP_LEVEL_DEFAULTS.search((directory / f"{name}.yaml").read_text()) is not None


def algorithm_configs(directory: Path = DECODER_DIR) -> list[str]:
    """The algorithm configs: one per decoder file and its defaults. The decoder contract and the audits run these."""
    return sorted(p.stem for p in directory.glob("*.yaml") if not is_variant(p.stem, directory))


def variant_configs(directory: Path = DECODER_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml") if is_variant(p.stem, directory))


def settle_named_rows(cfg: DictConfig) -> DictConfig:
    """`cfg` with its overlay rows as they run (in place): `named_decoders.<row>` is named `<row>`, and where
    `named_window` is set, every row whose decoder takes the window family's settings (sjd.decoders.window) runs at
    it; other rows (PJD's row window, EAGLE's tree) keep their own."""
    rows = cfg.get("named_decoders") or {}
    follow = cfg.get("named_window") is not None
    with open_dict(cfg):
        for row, node in rows.items():
            node.name = row
            if follow and issubclass(get_class(node._target_), WindowSettings):
                node.window = "${named_window}"  # an interpolation: it follows the run's value, overrides included
    return cfg
