"""CLIP score through torchmetrics' `CLIPScore`, with the backend chosen by config.

Backends (`eval.clip.backend`):
- `toy`: the toy CLIP (sjd/toy/clip.py), so toy scores mean something;
- `hf`: a transformers CLIP from a local directory or hub id (SJD: openai/clip-vit-base-patch16,
  x100, images at 299). transformers 5.x returns a ModelOutput from `get_*_features`, which
  torchmetrics does not expect, so the model is wrapped to return the projected embeddings.
- `open_clip`: an open_clip architecture (`eval.clip.model`, e.g. ViT-B-32) with weights from
  `eval.clip.pretrained`: a checkpoint file, or a tag of that architecture (e.g. `openai`) whose
  file is already in the local Hugging Face cache, or `random` (tests). Nothing is downloaded:
  a missing file is an error naming the key, the path and how to fetch it. LANTERN's protocol
  (OpenAI CLIP ViT-B/32, raw cosine, images at 256, captions prefixed "A photo depicts ") is
  `eval=coco_lantern`. open_clip needs torchvision (the `eval` extra; sjd/torchvision_compat.py).
Every backend is scored by torchmetrics' own code through a `(model, processor)` pair that
exposes `get_image_features`/`get_text_features`: max(mean(100 * cos), 0) over the pairs.
`eval.clip.scale` rescales it (0.01 = raw cosine).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import torch
from PIL import Image
from torchmetrics.multimodal.clip_score import CLIPScore

from sjd.eval.protocols import LOCAL_METRIC, preprocess
from sjd.toy.clip import ToyCLIPProcessor, load_toy_clip

BACKENDS = ("toy", "hf", "open_clip")
CHECKPOINT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class _HFFeatures(torch.nn.Module):
    """A transformers CLIPModel whose get_*_features return tensors, as torchmetrics expects."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model, self.config = model, model.config

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.model.get_image_features(pixel_values=pixel_values)
        return out if isinstance(out, torch.Tensor) else out.pooler_output

    def get_text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        out = self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
        return out if isinstance(out, torch.Tensor) else out.pooler_output


class _OpenCLIPFeatures(torch.nn.Module):
    """An open_clip model behind the two methods torchmetrics' CLIPScore calls."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        # torchmetrics truncates captions to config.text_config.max_position_embeddings when that
        # exists; open_clip's tokenizer already pads and truncates to the model's context length
        self.config = SimpleNamespace()

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(pixel_values)

    def get_text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model.encode_text(input_ids)  # open_clip pools by its own rule (EOT token) and takes no mask


class _OpenCLIPProcessor:
    """open_clip's image transform and tokenizer in the call shape of a transformers CLIPProcessor."""

    def __init__(self, image_transform: Callable, tokenizer: Callable) -> None:
        self.image_transform, self.tokenizer = image_transform, tokenizer

    def __call__(self, text=None, images=None, return_tensors: str = "pt", padding: bool = True) -> dict:
        if images is not None:
            # the transform is the one open_clip pairs with the weights (resize, crop, normalise); it
            # takes PIL images, as in OpenAI's and LANTERN's evaluation code
            pil = [Image.fromarray(img.permute(1, 2, 0).cpu().numpy()) for img in images]
            return {"pixel_values": torch.stack([self.image_transform(p) for p in pil])}
        ids = self.tokenizer(list(text))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}  # only its shape is read


def import_open_clip() -> ModuleType:
    from sjd.torchvision_compat import import_torchvision

    import_torchvision()  # open_clip imports torchvision at once; this makes that work on the CPU torch
    try:
        import open_clip
    except ModuleNotFoundError as e:
        if e.name != "open_clip":
            raise
        raise ModuleNotFoundError(
            "eval.clip.backend=open_clip needs open_clip_torch, which comes with the eval extra: "
            "pip install -e '.[eval]' (or make install)"
        ) from e
    return open_clip


def _is_path(pretrained: str) -> bool:
    return os.sep in pretrained or "/" in pretrained or pretrained.endswith(CHECKPOINT_SUFFIXES)


def _cached_tag_file(open_clip: ModuleType, model: str, tag: str, cfg: dict, cache_dir: str | None) -> str:
    """The local file of an open_clip tag, looked up in the Hugging Face cache and never downloaded."""
    from huggingface_hub import constants, try_to_load_from_cache

    if not cfg.get("hf_hub"):
        raise FileNotFoundError(
            f"eval.clip.pretrained: open_clip publishes tag {tag!r} of {model} only at {cfg.get('url')}; download "
            "that file and set `eval.clip.pretrained` to its path"
        )
    # open_clip's convention: 'org/repo/' means the default file names, 'org/repo/file' one named file
    repo_id, filename = os.path.split(cfg["hf_hub"])
    if filename:  # a safetensors twin is preferred where the repo has one, as open_clip does
        names = list(dict.fromkeys([str(Path(filename).with_suffix(".safetensors")), filename]))
    else:
        names = [open_clip.constants.HF_SAFE_WEIGHTS_NAME, open_clip.constants.HF_WEIGHTS_NAME]
    for name in names:
        found = try_to_load_from_cache(repo_id, name, cache_dir=cache_dir)
        if isinstance(found, str):
            return found
    cache = cache_dir or constants.HF_HUB_CACHE
    raise FileNotFoundError(
        f"eval.clip.pretrained: the weights of open_clip {model} tag {tag!r} are not in the Hugging Face cache "
        f"{cache} (looked for {', '.join(names)} of {repo_id}). Nothing is downloaded here: on a machine with "
        f"network run `hf download {repo_id} {names[0]}` (with HF_HUB_CACHE pointing at this cache), or set "
        "`eval.clip.pretrained` to a checkpoint file."
    )


def resolve_open_clip_weights(
    model: str | None, pretrained: str | None, cache_dir: str | None = None
) -> tuple[str, str | None, dict]:
    """(architecture, checkpoint file or None for random weights, extra open_clip build arguments).

    Fails, naming the config key, on an unknown architecture or tag and on a file that is not there.
    """
    open_clip = import_open_clip()
    arch = (model or "").replace("/", "-")  # open_clip's own spelling: ViT-B/32 -> ViT-B-32
    if arch not in open_clip.list_models():
        raise ValueError(f"eval.clip.model: open_clip has no architecture {model!r} (e.g. ViT-B-32, ViT-B-16)")
    if not pretrained:
        raise ValueError(
            "eval.clip.pretrained: set a tag of the architecture (e.g. openai), a checkpoint file, or `random`"
        )
    if pretrained == "random":
        return arch, None, {}
    if _is_path(pretrained):
        if not Path(pretrained).is_file():
            raise FileNotFoundError(f"eval.clip.pretrained: checkpoint file {pretrained} not found")
        return arch, pretrained, {}
    cfg = open_clip.get_pretrained_cfg(arch, pretrained)
    if not cfg:
        tags = open_clip.list_pretrained_tags_by_model(arch)
        raise ValueError(
            f"eval.clip.pretrained: {pretrained!r} is neither a checkpoint file nor an open_clip tag of {arch} "
            f"(tags: {', '.join(tags) or 'none'})"
        )
    # what open_clip applies when it loads a tag itself: the activation the weights were trained
    # with (OpenAI's are QuickGELU) and the tag's image normalisation
    build = {"force_quick_gelu": bool(cfg.get("quick_gelu", False))}
    build.update({f"image_{k}": cfg.get(k) for k in ("mean", "std", "interpolation", "resize_mode")})
    return arch, _cached_tag_file(open_clip, arch, pretrained, cfg, cache_dir), build


def load_open_clip(
    model: str | None, pretrained: str | None, cache_dir: str | None = None
) -> tuple[torch.nn.Module, Callable, Callable]:
    """(model in eval mode, image transform, tokenizer) from local files only."""
    open_clip = import_open_clip()
    arch, checkpoint, build = resolve_open_clip_weights(model, pretrained, cache_dir)
    # pretrained_image/text=False: no tower may fetch base weights of its own behind our back
    clip, _, image_transform = open_clip.create_model_and_transforms(
        arch, pretrained=checkpoint, weights_only=True, pretrained_image=False, pretrained_text=False, **build
    )
    return clip.eval(), image_transform, open_clip.get_tokenizer(arch)


def check_clip_weights(clip_cfg: dict) -> None:
    """Fail before any model is loaded if the open_clip weights named by the config are not here."""
    if clip_cfg.get("backend") == "open_clip":
        resolve_open_clip_weights(clip_cfg.get("model"), clip_cfg.get("pretrained"))


def clip_model_label(clip_cfg: dict) -> str:
    """What a results row records as the CLIP model."""
    label = f"{clip_cfg['backend']}:{clip_cfg.get('model')}"
    return f"{label}:{clip_cfg['pretrained']}" if clip_cfg.get("pretrained") else label


def clip_loader(backend: str, model: str | None = None, pretrained: str | None = None) -> Callable[[], tuple]:
    """A zero-argument callable returning (model, processor), as CLIPScore accepts."""
    if backend == "toy":
        return lambda: (load_toy_clip(model, config_key="eval.clip.model"), ToyCLIPProcessor())
    if backend == "hf":
        from transformers import CLIPModel, CLIPProcessor

        local = model is not None and Path(model).is_dir()
        return lambda: (
            _HFFeatures(CLIPModel.from_pretrained(model, local_files_only=local).eval()),
            CLIPProcessor.from_pretrained(model, local_files_only=local),
        )
    if backend == "open_clip":

        def _load() -> tuple:
            clip, image_transform, tokenizer = load_open_clip(model, pretrained)
            return _OpenCLIPFeatures(clip), _OpenCLIPProcessor(image_transform, tokenizer)

        return _load
    raise ValueError(f"eval.clip.backend must be one of {', '.join(BACKENDS)}; got {backend!r}")


def clip_score(
    images: np.ndarray,
    captions: Sequence[str],
    backend: str = "toy",
    model: str | None = None,
    protocol: str = "sjd",
    prefix: str = "",
    scale: float = 1.0,
    batch: int = 64,
    pretrained: str | None = None,
) -> float:
    """Mean CLIP score of images [N, H, W, 3] uint8 against their captions."""
    if len(images) != len(captions):
        raise ValueError(f"clip_score: {len(images)} images but {len(captions)} captions")
    metric = CLIPScore(model_name_or_path=clip_loader(backend, model, pretrained), **LOCAL_METRIC)
    with torch.no_grad():
        for i in range(0, len(images), batch):
            pixels = preprocess(images[i : i + batch], protocol)
            metric.update(list(pixels), [prefix + c for c in captions[i : i + batch]])
    return float(metric.compute()) * scale
