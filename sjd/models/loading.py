"""Where an adapter's weights come from, with one set of rules for every model.

`resolve_checkpoint` turns a config value into what `from_pretrained` gets: a local directory that
holds a transformers checkpoint (its config.json and *.safetensors), or a hub id (`owner/repo`) that
is not a local path. Anything else is a missing checkpoint, reported before anything loads with the
model, the path and the config key to set. `torch_dtype` reads `model.adapter.dtype` the same way
for every adapter, and `could_not_load` words a failed `from_pretrained` (a hub id not cached while
offline, an incomplete directory) alike everywhere. `tensors_sha` and `networks_sha` name weights by
their bytes: a run records the hash of the networks it decoded with.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

WEIGHTS_KEY = "model.adapter.weights"
DTYPE_KEY = "model.adapter.dtype"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/repo
CHECKPOINT_FILES = "config.json, *.safetensors and the tokenizer files"

TextEncoder = Callable[[str], Sequence[int]]


def torch_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """`auto` (or null): bfloat16 on a GPU, float32 on the CPU; otherwise the dtype named."""
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"{DTYPE_KEY} must be auto or one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def resolve_checkpoint(
    weights: str | Path,
    name: str,
    title: str,
    key: str = WEIGHTS_KEY,
    contents: str = CHECKPOINT_FILES,
    hub_example: str | None = None,
) -> tuple[str, bool]:
    """(what from_pretrained gets, whether it is local) for the `title` checkpoint of model `name`.

    A directory must hold config.json and *.safetensors. A value is a hub id only when it reads
    `owner/repo` and is no local path: not absolute, not starting with `.` or `~`, nothing at that
    path, and `owner` not a local directory."""
    text = str(weights)
    path = Path(text).expanduser()
    example = f" (e.g. {hub_example})" if hub_example else ""
    fix = (
        f"Set `{key}` to a directory holding the {title} checkpoint in transformers format ({contents}), "
        f"or to a hub id{example} while online."
    )
    if path.is_dir():
        if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
            raise FileNotFoundError(f"model {name!r} ({title}): {path} holds no config.json / *.safetensors. {fix}")
        return str(path), True
    looks_local = (
        path.exists() or path.is_absolute() or text.startswith((".", "~")) or Path(text.split("/")[0]).is_dir()
    )
    if looks_local or not HUB_ID.match(text):
        raise FileNotFoundError(f"model {name!r} ({title}): checkpoint directory {path.absolute()} not found. {fix}")
    return text, False


def could_not_load(err: OSError, name: str, title: str, source: str, key: str = WEIGHTS_KEY) -> FileNotFoundError:
    """The error to raise from a `from_pretrained` that failed on a resolved checkpoint."""
    return FileNotFoundError(
        f"model {name!r} ({title}): could not load {source!r} ({err}). Set `{key}` to a local checkpoint "
        "directory in transformers format, or to a hub id while online."
    )


def as_encoder(tokenizer) -> TextEncoder:
    """A transformers tokenizer (no special tokens added) or any callable str -> ids."""
    if hasattr(tokenizer, "encode"):
        return lambda text: list(tokenizer.encode(text, add_special_tokens=False))
    if callable(tokenizer):
        return tokenizer
    raise TypeError(f"need a tokenizer or a callable str -> ids, got {type(tokenizer).__name__}")


def tensors_sha(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 of named tensors (names sorted; dtype, shape and bytes of each): equal only when bit for bit equal."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def networks_sha(networks: dict[str, torch.nn.Module]) -> str:
    """The first 16 hex digits of tensors_sha over every parameter and buffer of `networks`, as held (after
    loading, the dtype cast and any tying): the weights a run decoded with, whatever files they came from.
    On a GPU this copies each tensor to the host once, seconds for a 7B model."""
    return tensors_sha({f"{name}.{k}": v for name, net in networks.items() for k, v in net.state_dict().items()})[:16]
