"""Start-up checks of a run config: every value of the right type, and the device there, before any
model loads. A bad value is refused naming its config key, what it is, and what was expected.

The expected types come from where the values go: the top-level keys from `RUN_KEYS` below; the
settings of a `_target_` node (decoder, baseline, extra_decoders, named_decoders, model.adapter, logger) from its
class's constructor signature; `prompts` from `load_prompt_set`'s, `model.sampling` from
`SamplingConfig`'s fields and `shadow` from `ShadowSettings`' (sjd/harness/shadow.py, which adds its value rules).
So a new decoder setting is checked as soon as it has a type hint.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

# Top-level keys of conf/config.yaml: (type, the rule a set value must meet, that rule in words).
RUN_KEYS: dict[str, tuple[Any, Callable[[Any], bool] | None, str]] = {
    "seed": (int, None, ""),
    "device": (str, None, ""),
    "batch_size": (int, lambda v: v >= 1, ">= 1"),
    "cache": (str, lambda v: v in ("dynamic", "static"), "dynamic or static"),
    "compile": (bool, None, ""),
    "compile_mode": (
        str | None,
        lambda v: v in ("default", "reduce-overhead", "max-autotune"),
        "default, reduce-overhead or max-autotune",
    ),
    "compile_strict": (bool, None, ""),
    "compile_backend": (str | None, lambda v: v in ("inductor", "aot_eager", "eager"), "inductor, aot_eager or eager"),
    "warmup": (int, lambda v: v >= 0, ">= 0"),
    "save_images": (bool, None, ""),
    "grid_prompts": (int, lambda v: v >= 0, ">= 0"),
    "extra_decoders": (list | None, None, ""),
    "named_decoders": (dict | None, None, ""),
    "named_window": (int | None, lambda v: v >= 1, ">= 1"),
    "experiment_name": (str | int | None, None, ""),
    "results_csv": (str | None, None, ""),
    "dist_timeout_min": (float, lambda v: v > 0, "> 0"),
}


MISSING = "???"  # a value the config leaves to the user: whoever reads it says which key to set


class ConfigError(ValueError):
    """A run config value that cannot work; the message names every offending key."""


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def accepts(annotation: Any, value: Any) -> bool:
    """Whether `value` (a plain YAML value) fits the type hint; True where the hint is not a plain type."""
    origin = typing.get_origin(annotation)
    if annotation is Any or annotation is inspect.Parameter.empty:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(accepts(a, value) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if annotation is Path:
        return isinstance(value, str | Path)
    base = origin or annotation
    if isinstance(base, type) and issubclass(base, Mapping):
        return isinstance(value, Mapping)
    if isinstance(base, type) and issubclass(base, Sequence) and base is not str:
        return isinstance(value, list | tuple)
    return True  # a class of our own, a callable, ...: instantiate decides


def _hints(fn: Callable) -> dict[str, Any]:
    """Resolved type hints of `fn`'s parameters; a hint that cannot be resolved is left out."""
    try:
        return typing.get_type_hints(fn)
    except Exception:  # a hint naming something imported only for type checking
        module = inspect.getmodule(fn)
        hints = {}
        for name, annotation in getattr(fn, "__annotations__", {}).items():
            try:
                hints[name] = eval(annotation, vars(module)) if isinstance(annotation, str) else annotation
            except Exception:
                continue
        return hints


def check_settings(key: str, values: Mapping[str, Any], fn: Callable, skip: Sequence[str] = ()) -> list[str]:
    """Problems of the settings `values` (config node `key`) passed to `fn` as keyword arguments."""
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    hints, where = _hints(fn), getattr(fn, "__qualname__", str(fn)).replace(".__init__", "")
    problems = []
    for name, value in values.items():
        if name.startswith("_") or name in skip or value == MISSING:
            continue
        if name not in params:
            if not takes_any:
                known = ", ".join(p for p in params if p not in ("self", *skip))
                problems.append(f"{key}.{name}: {where} has no setting {name!r} (its settings: {known})")
            continue
        if name in hints and not accepts(hints[name], value):
            problems.append(f"{key}.{name}={value!r}: expected {_type_name(hints[name])} ({where}.{name})")
    return problems


def _target_problems(key: str, node: Mapping[str, Any]) -> list[str]:
    from hydra.utils import get_class

    try:
        target = get_class(node["_target_"])
    except Exception as e:  # an unknown class or module: say which key names it
        return [f"{key}._target_={node['_target_']!r} cannot be imported ({e})"]
    # device is given by the runner, not the config
    return check_settings(key, node, target.__init__, skip=("device",) if key == "model.adapter" else ())


def check_device(name: str, cuda: Any = torch.cuda) -> None:
    """Refuse a device that this machine does not have, saying what was asked for and what was found."""
    if name == "auto":
        return
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"device={name!r} is not a torch device (auto, cpu, cuda, cuda:N): {e}") from None
    if device.type != "cuda":
        return
    if not cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA (a CPU wheel)"
        raise ConfigError(
            f"device={name}: a CUDA device was asked for, but none is available here (torch {torch.__version__}, "
            f"{built}; {cuda.device_count()} GPU(s) visible). Use device=cpu, or device=auto to pick cuda when present."
        )
    if device.index is not None and device.index >= cuda.device_count():
        raise ConfigError(f"device={name}: only {cuda.device_count()} GPU(s) are visible (cuda:0 ...)")


def check_run_config(cfg: DictConfig) -> None:
    """Every check above on a composed run config; raises ConfigError listing each problem."""
    from sjd.core.sampling import SamplingConfig
    from sjd.harness.prompts import load_prompt_set

    plain = OmegaConf.to_container(cfg, resolve=True)
    problems = []
    for key, (annotation, rule, rule_text) in RUN_KEYS.items():
        if key not in plain:
            continue
        value = plain[key]
        if value == MISSING:
            continue
        if not accepts(annotation, value):
            problems.append(f"{key}={value!r}: expected {_type_name(annotation)}")
        elif rule is not None and value is not None and not rule(value):
            problems.append(f"{key}={value!r}: must be {rule_text}")
    if plain.get("compile") is True and isinstance(plain.get("warmup"), int) and plain["warmup"] < 1:
        problems.append("compile=true needs warmup >= 1: the warm-up batch compiles, and no timed batch may")
    targets = [("decoder", plain.get("decoder")), ("baseline", plain.get("baseline"))]
    targets += [(f"extra_decoders[{i}]", d) for i, d in enumerate(plain.get("extra_decoders") or [])]
    targets += [(f"named_decoders.{k}", d) for k, d in (plain.get("named_decoders") or {}).items()]
    targets += [("model.adapter", (plain.get("model") or {}).get("adapter")), ("logger", plain.get("logger"))]
    for key, node in targets:
        if isinstance(node, Mapping) and "_target_" in node:
            problems += _target_problems(key, node)
    if isinstance(plain.get("prompts"), Mapping):
        problems += check_settings("prompts", plain["prompts"], load_prompt_set)
    if isinstance(plain.get("shadow"), Mapping):
        from sjd.harness.shadow import shadow_problems

        problems += shadow_problems(plain["shadow"])
    sampling = (plain.get("model") or {}).get("sampling")
    if isinstance(sampling, Mapping):
        fields = {f.name: f.type for f in dataclasses.fields(SamplingConfig)}
        hints = typing.get_type_hints(SamplingConfig)
        for name, value in sampling.items():
            if name not in fields:
                problems.append(f"model.sampling.{name}: not a sampling setting (settings: {', '.join(fields)})")
            elif value != MISSING and not accepts(hints[name], value):
                problems.append(f"model.sampling.{name}={value!r}: expected {_type_name(hints[name])}")
    if problems:
        raise ConfigError("bad config value(s):\n  " + "\n  ".join(problems))
    check_device(plain.get("device", "auto"))
