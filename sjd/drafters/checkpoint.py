"""Drafter checkpoints: the released EAGLE / LANTERN layout, our recipe's, and a seeded random one.

A drafter directory holds `config.json` (the target's config with `num_hidden_layers: 1`, optionally
`"bias": false` for an fc without bias, and for LlamaGen drafters LANTERN's `input_type`) and its weights in
`model.safetensors` or `pytorch_model.bin` (read with `torch.load(weights_only=True)`; no pickled code runs),
with the key names of sjd.drafters.net. When a directory holds both, `model.safetensors` is read: it runs no
unpickler at all, and a repository that ships both ships the same tensors twice (LANTERN's own loader tries
`pytorch_model.bin` first, which matters only if the two differ). `embed_tokens.weight` may be absent (EAGLE's
own loader copies the target's embedding, as we do then); LANTERN's files carry it. Lumina-mGPT's q/k norms,
stored one row per model-parallel shard ([shards, head_dim]), are expanded to one row per head on load, as the
target's are (sjd.models.chameleon). Our recipe adds `drafter.json` with its training record
(sjd.drafters.recipe).

`decoder.drafter.weights` is such a directory, or `random` / `random:SEED`: an untrained drafter with seeded
weights and the target's embedding, for models that are random themselves (the micro model) and for tests.
Exactness never depends on the drafter; only how much it accepts does.

A drafter is checked against the target before it is used: the layer family, hidden size and vocabulary must
match, it has one layer, and a LlamaGen drafter's `input_type` names the target's grid (the error names the
key and both values); the loaded network is kept per (directory, model, device) so a run loads it once,
however many calls decode with it. The network takes the target's dtype.
"""

from __future__ import annotations

import json
import pickle
import weakref
from pathlib import Path

import torch

from sjd.drafters.net import DrafterConfig, DrafterNet, config_from_architecture, family_of
from sjd.models.base import ModelAdapter

WEIGHTS_KEY = "decoder.drafter.weights"
# LANTERN's LlamaGen drafters name the target they were trained for by `input_type`: codes per side.
INPUT_TYPE_GRID = {"c2i": 24, "t2i": 16, "t2i2": 32}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
RECORD_FILE = "drafter.json"
_LOADED: dict[tuple, tuple[weakref.ref, DrafterNet]] = {}


def random_seed(weights: str) -> int | None:
    """The seed of `random` / `random:SEED`, None for a directory."""
    if weights == "random":
        return 0
    if weights.startswith("random:"):
        try:
            return int(weights.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"{WEIGHTS_KEY}={weights!r}: expected random or random:SEED (an integer)") from None
    return None


PROJECT_ROOT = Path(__file__).resolve().parents[2]


def resolve(weights: str) -> Path:
    """A drafter directory: absolute as given; a relative one from the working directory, else from the
    project root (so `sjd/assets/...` works from anywhere)."""
    path = Path(weights).expanduser()
    if path.is_absolute() or path.exists():
        return path
    return PROJECT_ROOT / path


def check_weights_setting(weights: str | None, decoder: str, key: str = WEIGHTS_KEY) -> None:
    """Before any model loads: a drafter is named and, unless random, its directory has a config and weights."""
    if weights is None:
        raise ValueError(
            f"decoder {decoder!r} needs a trained drafter: set `{key}` to a drafter directory (config.json and "
            "model.safetensors or pytorch_model.bin, e.g. a released LANTERN drafter, or one from "
            "`python scripts/train_drafter.py model=NAME`), or `random` for an untrained one"
        )
    if random_seed(str(weights)) is not None:
        return
    path = resolve(str(weights))
    if not path.is_dir():
        raise FileNotFoundError(f"decoder {decoder!r}: `{key}`={weights}: no drafter directory at {path.absolute()}")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"decoder {decoder!r}: no drafter config.json in {path.absolute()} (from `{key}`)")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise FileNotFoundError(
            f"decoder {decoder!r}: no drafter weights ({' or '.join(WEIGHT_FILES)}) in {path.absolute()} (from `{key}`)"
        )


DRAFT_HEADS = ("full", "codes")  # the LM head a drafter or draft heads run: every row, or the image codes' rows


def check_draft_head(head: str, key: str) -> str:
    """`full` (the target's whole LM head, as the published drafters run it) or `codes` (only the image codes'
    rows, ModelAdapter.code_head: the same q, fewer bytes)."""
    if head not in DRAFT_HEADS:
        raise ValueError(f"{key} must be one of {DRAFT_HEADS}, got {head!r}")
    return head


def drafter_settings(drafter: dict | None, decoder: str, default_head: str) -> dict:
    """`decoder.drafter` of a drafter decoder, checked before any model loads: `weights` (check_weights_setting)
    and `head` (check_draft_head; `default_head` when absent)."""
    drafter = dict(drafter or {})
    unknown = sorted(set(drafter) - {"weights", "head"})
    if unknown:
        raise ValueError(f"decoder.drafter: unknown setting(s) {unknown} (settings: weights, head)")
    check_weights_setting(drafter.get("weights"), decoder)
    head = check_draft_head(str(drafter.get("head", default_head)), "decoder.drafter.head")
    return {"weights": str(drafter["weights"]), "head": head}


def read_config(path: Path, key: str = WEIGHTS_KEY) -> dict:
    f = path / "config.json"
    try:
        config = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"`{key}`: cannot read the drafter config {f}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"`{key}`: the drafter config {f} is not a JSON object")
    return config


def check_against_target(drafter: dict, target: dict, where: str, key: str = WEIGHTS_KEY) -> None:
    """Refuse a drafter config that does not fit the target, naming the key and both values."""
    problems = []
    for name in ("hidden_size", "vocab_size"):
        if int(drafter.get(name, -1)) != int(target[name]):
            problems.append(f"{name} {drafter.get(name)} (the target's: {target[name]})")
    if family_of(drafter) != family_of(target):
        problems.append(f"a {family_of(drafter)} layer (the target is a {family_of(target)} model)")
    layers = drafter.get("num_hidden_layers", 1)
    if layers != 1:
        problems.append(f"num_hidden_layers {layers} (a drafter has 1)")
    input_type = drafter.get("input_type")
    if input_type is not None and "grid_size" in target:
        grid = INPUT_TYPE_GRID.get(str(input_type))
        if grid is None:
            problems.append(f"input_type {input_type!r} (known: {sorted(INPUT_TYPE_GRID)})")
        elif grid != int(target["grid_size"]):
            problems.append(
                f"input_type {input_type!r}, a {grid}x{grid}-code drafter (the target's grid: "
                f"{target['grid_size']}x{target['grid_size']})"
            )
    if problems:
        raise ValueError(f"`{key}`: the drafter at {where} does not fit the target: " + "; ".join(problems))


def read_weights(path: Path, key: str = WEIGHTS_KEY) -> dict[str, torch.Tensor]:
    """The state dict of the first of WEIGHT_FILES in `path` (module docstring: why safetensors first)."""
    for name in WEIGHT_FILES:
        f = path / name
        if not f.is_file():
            continue
        if f.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(f))
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError) as e:  # the restricted unpickler refused it
            raise ValueError(
                f"`{key}`: {f} is not a plain state dict of tensors (read with torch.load(weights_only=True), "
                f"which runs no pickled code): {unpickler_reason(e)}"
            ) from None
        bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)] if isinstance(state, dict) else None
        if bad is None or bad:
            what = type(state).__name__ if bad is None else f"non-tensor entries {sorted(map(str, bad))[:5]}"
            raise ValueError(f"`{key}`: {f} is not a state dict of tensors: it holds {what}")
        return state
    raise FileNotFoundError(f"`{key}`: no drafter weights ({' or '.join(WEIGHT_FILES)}) in {path}")


def unpickler_reason(error: Exception) -> str:
    """The line of torch's long weights-only message that says what was refused (e.g. the class)."""
    text = str(error)
    marker = "WeightsUnpickler error:"
    if marker in text:
        return text.split(marker, 1)[1].strip().split(". ")[0]
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def per_head_qk_norms(state: dict[str, torch.Tensor], cfg: DrafterConfig, key: str = WEIGHTS_KEY) -> None:
    """Expand q/k-norm tensors stored per model-parallel shard ([shards, head_dim], Lumina-mGPT's) to one row
    per head, in place, the way the target's loader does."""
    norms = [k for k in state if ".q_norm." in k or ".k_norm." in k]
    if not cfg.qk_norm or not norms:
        return
    from sjd.models.chameleon import qk_norm_to_transformers

    for k in norms:
        try:
            state[k] = qk_norm_to_transformers(k, state[k], cfg)
        except ValueError as e:
            raise ValueError(f"`{key}`: {e}") from None


def drafter_config(adapter: ModelAdapter, weights: str) -> DrafterConfig:
    """The drafter's config for this target: from its config.json, or the target's own for `random`."""
    target = adapter.architecture()
    if random_seed(weights) is not None:
        return config_from_architecture(target)
    path = resolve(weights)
    config = read_config(path)
    check_against_target(config, target, str(path))
    arch = {**config}
    for key in ("grid_size", "cls_token_num"):  # the 2-D rotary table is the target's
        if key in target:
            arch.setdefault(key, target[key])
    return config_from_architecture(arch)


def load_drafter(adapter: ModelAdapter, weights: str) -> DrafterNet:
    """The drafter network for `adapter`, in the target's dtype and on its device (loaded once per
    directory, model and device). On a shadowed model, a copy whose calls a twin at the shadow's widths also runs
    (sjd/drafters/shadow.py)."""
    from sjd.drafters.shadow import drafter_beside_shadow

    key = (str(weights), str(adapter.device))
    held = _LOADED.get(key)
    if held is None or held[0]() is not adapter:  # another model (or the same one rebuilt): load afresh
        _LOADED.clear()  # one drafter at a time: a run uses one model
        _LOADED[key] = (weakref.ref(adapter), drafter_beside_shadow(build(adapter, weights), adapter))
    return _LOADED[key][1]


def build(adapter: ModelAdapter, weights: str) -> DrafterNet:
    cfg = drafter_config(adapter, weights)
    embedding = adapter.token_embeddings().detach()
    seed = random_seed(weights)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed or 0)
        net = DrafterNet(cfg)
    if seed is None:
        path = resolve(weights)
        state = read_weights(path)
        per_head_qk_norms(state, cfg)
        if "embed_tokens.weight" not in state:
            state["embed_tokens.weight"] = embedding.cpu()
        expected = net.state_dict()
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        wrong = [k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
        if missing or unexpected or wrong:
            raise ValueError(
                f"`{WEIGHTS_KEY}`: {path} is not a {cfg.family} drafter of this target: missing {missing}, "
                f"unexpected {unexpected}, wrong shape {[(k, tuple(state[k].shape)) for k in wrong]}"
            )
        net.load_state_dict(state)
    else:
        with torch.no_grad():
            net.embed_tokens.weight.copy_(embedding.float().cpu())
    dtype = embedding.dtype if embedding.is_floating_point() else torch.float32
    return net.to(device=adapter.device, dtype=dtype).eval()


def save_drafter(net: DrafterNet, directory: Path, target_architecture: dict, record: dict | None = None) -> None:
    """config.json (the target's config with one layer, in the released layout), model.safetensors and,
    for our recipe, drafter.json with the training record."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = {**target_architecture, "num_hidden_layers": 1, "bias": net.config.fc_bias}
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    state = {k: v.detach().contiguous().cpu() for k, v in net.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    if record is not None:
        (directory / RECORD_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))


def training_record(weights: str) -> dict | None:
    """Our recipe's record of a drafter directory (recipe and hashes), None for others."""
    if random_seed(str(weights)) is not None:
        return {"random_seed": random_seed(str(weights))}
    f = resolve(str(weights)) / RECORD_FILE
    return json.loads(f.read_text()) if f.is_file() else None
