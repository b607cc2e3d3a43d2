"""What Lumina-mGPT and Anole share: both are Chameleon models in transformers' own classes.

One vocabulary of 65536 ids holds text, the 8192 image codes (BPE tokens named `IMGIMG<digits as
A..J>Z`) and the image specials (begin-of-image `<racm3:break>`, end-of-image `<eoss>`,
end-of-turn `<reserved08706>`); every id is read from the config's `vocabulary_map` by name.

Logits. transformers' `ChameleonForConditionalGeneration.forward` sets every image-code logit to
the dtype minimum (it serves text generation only), so the adapter runs the backbone
(`model.model`) and applies `lm_head` itself (sjd.models.causal_lm, as for every causal LM here):
raw logits over the whole vocabulary.

Prompt rows. `[BOS] + encode(question) + [end-of-turn]`, the official scripts' single-turn
prompt (the models answer after an end-of-turn; see lumina.py and anole.py for each question).

CFG. The SJD paper's construction (docs/algorithms.md §1.4), the same for AR and every decoder: the
batch is doubled, and the unconditional row of a prompt sees only the prompt's last token
(end-of-turn) and the generated tokens, at positions 0, 1, 2, ... The official code gets this by
masking the first prompt_len - 1 tokens of a copy of the conditional row and shifting its
positions; here the unconditional row is the one-token prompt `[end-of-turn]`, left-padded to the
batch width, and the ragged cache turns the padding into unattended holes and numbers positions
from the row's first real token, which gives the same attention and the same positions.
Guidance `uncond + s * (cond - uncond)` is applied by the shared pipeline (sjd.core.sampling).

Grammar. Every non-code position of the stream is forced (begin-of-image, Lumina's size and
end-of-line tokens, end-of-image, Lumina's end-of-turn), so the official "no CFG outside the
image" and text top-k rules never matter: a forced position is one-hot whatever the logits.

Images. Codes -> pixels through our Chameleon VQGAN (sjd.models.nets.chameleon_vqgan); transformers'
Chameleon has no image decoder.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sjd.models.base import codebook_by_id
from sjd.models.causal_lm import CausalLMAdapter
from sjd.models.loading import WEIGHTS_KEY, TextEncoder, as_encoder, could_not_load, resolve_checkpoint, torch_dtype
from sjd.models.nets.chameleon_vqgan import CONFIG_KEY as VQGAN_KEY
from sjd.models.nets.chameleon_vqgan import ChameleonVQGAN, load_vqgan
from sjd.types import CODE_EMBEDDINGS, CUSTOM_MASK, FEATURES, WINDOW, ImageLayout, Prompt

IMAGE_START = "<racm3:break>"
IMAGE_END = "<eoss>"
END_OF_TURN = "<reserved08706>"
BOS_TOKEN = "<s>"  # the tokenizer's BOS, which the official prompts start with
IMAGE_CODE = re.compile(r"^IMGIMG([A-J]+)Z$")  # code index spelled with A..J for the digits 0..9

_QK_NORM = re.compile(r"self_attn\.(q_norm|k_norm)\.(weight|bias)$")


@dataclass(frozen=True)
class ChameleonVocab:
    """The ids the adapters need, read by name from the config's vocabulary map."""

    bos: int
    image_start: int
    image_end: int
    end_of_turn: int
    code_ids: torch.Tensor  # [n_codes] long: the vocabulary id of VQ code i
    vocab_size: int
    names: Mapping[str, int] = field(repr=False)

    @classmethod
    def from_config(cls, config, name: str, bos: int | None = None) -> ChameleonVocab:
        """`bos`: the tokenizer's BOS id, which the official prompts use; the config's when None."""
        vmap = dict(config.vocabulary_map or {})
        if not vmap:
            raise ValueError(f"model {name!r}: the Chameleon config has no vocabulary_map")
        codes = {int(m.group(1).translate(_LETTER_DIGITS)): i for t, i in vmap.items() if (m := IMAGE_CODE.match(t))}
        if not codes or sorted(codes) != list(range(len(codes))):
            raise ValueError(f"model {name!r}: vocabulary_map image tokens IMGIMG..Z must number the codes 0..N-1")
        self = cls(
            bos=int(config.bos_token_id if bos is None else bos),
            image_start=_lookup(vmap, IMAGE_START, name),
            image_end=_lookup(vmap, IMAGE_END, name),
            end_of_turn=_lookup(vmap, END_OF_TURN, name),
            code_ids=torch.tensor([codes[i] for i in range(len(codes))], dtype=torch.long),
            vocab_size=int(config.vocab_size),
            names=vmap,
        )
        top = max(int(self.code_ids.max()), self.image_start, self.image_end, self.end_of_turn)
        if top >= self.vocab_size:
            raise ValueError(f"model {name!r}: vocabulary_map id {top} is outside the {self.vocab_size}-id LM head")
        return self

    def id_of(self, token: str, model: str) -> int:
        return _lookup(self.names, token, model)


_LETTER_DIGITS = str.maketrans("ABCDEFGHIJ", "0123456789")


def _lookup(vmap: Mapping[str, int], token: str, name: str) -> int:
    if token not in vmap:
        raise ValueError(f"model {name!r}: vocabulary_map has no {token!r} token")
    return int(vmap[token])


def chameleon_layout(
    vocab: ChameleonVocab,
    height: int,
    width: int,
    prefix: Sequence[int],
    suffix: Sequence[int],
    end_of_line: int | None = None,
) -> ImageLayout:
    """`prefix`, then `height` rows of `width` free codes (each closed by `end_of_line` if given),
    then `suffix`; everything but the codes is forced."""
    if height < 1 or width < 1:
        raise ValueError(f"the code grid must be at least 1 x 1, got {height} x {width}")
    stride = width + (end_of_line is not None)
    body = height * stride
    forced = torch.full((len(prefix) + body + len(suffix),), -1, dtype=torch.long)
    forced[: len(prefix)] = torch.tensor(list(prefix), dtype=torch.long)
    if end_of_line is not None:
        forced[len(prefix) + width : len(prefix) + body : stride] = end_of_line
    forced[len(prefix) + body :] = torch.tensor(list(suffix), dtype=torch.long)
    free = torch.zeros(vocab.vocab_size, dtype=torch.bool)
    free[vocab.code_ids] = True
    return ImageLayout(
        n_tokens=len(forced),
        height=height,
        width=width,
        row_stride=stride,
        first_code=len(prefix),
        forced=forced,
        free_tokens=free,
        vocab_size=vocab.vocab_size,
    )


# -- checkpoints --------------------------------------------------------------------------------
def qk_norm_to_transformers(key: str, tensor: torch.Tensor, config) -> torch.Tensor:
    """A q/k-norm weight or bias in transformers' layout [heads, head_dim].

    Chameleon's original (and Lumina-mGPT's vendored) layer norm keeps one row per model-parallel
    shard, [shards, head_dim], and applies row s to that shard's consecutive block of heads
    (`repeat_interleave(heads // shards)`); transformers stores the expanded per-head rows. Tensors
    already in transformers' shape are returned as they are."""
    head_dim = config.hidden_size // config.num_attention_heads
    heads = config.num_attention_heads if ".q_norm." in key else config.num_key_value_heads
    if tuple(tensor.shape) == (heads, head_dim):
        return tensor
    if tensor.dim() != 2 or tensor.shape[1] != head_dim or heads % tensor.shape[0]:
        raise ValueError(
            f"{key}: shape {tuple(tensor.shape)} is neither [{heads}, {head_dim}] nor [shards, {head_dim}]"
        )
    return tensor.repeat_interleave(heads // tensor.shape[0], dim=0)


def state_dict_to_transformers(state: Mapping[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """A Chameleon state dict with its q/k-norm tensors mapped onto transformers' shapes."""
    return {k: qk_norm_to_transformers(k, v, config) if _QK_NORM.search(k) else v for k, v in state.items()}


def _safetensors_files(source: str, local: bool) -> dict[str, str]:
    """tensor name -> local safetensors file, for a single-file or a sharded checkpoint."""
    from transformers.utils import cached_file

    kw = {"local_files_only": local, "_raise_exceptions_for_missing_entries": False}
    index = cached_file(source, "model.safetensors.index.json", **kw)
    if index:
        folder = Path(index).parent
        return {k: str(folder / f) for k, f in json.loads(Path(index).read_text())["weight_map"].items()}
    single = cached_file(source, "model.safetensors", **kw)
    if not single:
        raise FileNotFoundError(f"{source}: no model.safetensors or model.safetensors.index.json")
    from safetensors import safe_open

    with safe_open(single, "pt") as f:
        return dict.fromkeys(f.keys(), single)


def _restore_qk_norms(model: torch.nn.Module, mismatched, source: str, local: bool, name: str) -> None:
    """Load the q/k-norm tensors from_pretrained skipped for their shape, mapped onto transformers'."""
    from safetensors import safe_open

    keys = sorted(k for k, *_ in mismatched)
    wrong = [k for k in keys if not _QK_NORM.search(k)]
    if wrong:
        raise ValueError(f"model {name!r}: checkpoint tensors of the wrong shape: {wrong}")
    files = _safetensors_files(source, local)
    params = dict(model.named_parameters())
    for key in keys:
        with safe_open(files[key], "pt") as f:
            tensor = qk_norm_to_transformers(key, f.get_tensor(key), model.config)
        with torch.no_grad():
            params[key].copy_(tensor.to(params[key].dtype))


def load_chameleon(
    weights: str, name: str, title: str, device: torch.device, dtype: str | None, trust_remote_code: bool
) -> tuple[torch.nn.Module, TextEncoder, int | None]:
    """(model, text encoder, tokenizer BOS id) from a transformers-format Chameleon checkpoint:
    safetensors only, q/k norms in either layout, remote code only when the config asks for it."""
    from transformers import AutoConfig, AutoTokenizer, ChameleonConfig, ChameleonForConditionalGeneration

    source, local = resolve_checkpoint(weights, name, title)
    load = {"local_files_only": local, "trust_remote_code": bool(trust_remote_code)}
    try:
        config = AutoConfig.from_pretrained(source, **load)
        if not isinstance(config, ChameleonConfig):
            raise ValueError(
                f"model {name!r}: {source!r} holds a {type(config).__name__}, not a transformers Chameleon "
                f"checkpoint; set `{WEIGHTS_KEY}` to one"
            )
        model, info = ChameleonForConditionalGeneration.from_pretrained(
            source,
            config=config,
            dtype=torch_dtype(dtype, device),
            use_safetensors=True,
            ignore_mismatched_sizes=True,  # Lumina's [shards, head_dim] q/k norms, restored below
            output_loading_info=True,
            **load,
        )
        tokenizer = AutoTokenizer.from_pretrained(source, **load)
        _restore_qk_norms(model, info["mismatched_keys"], source, local, name)
    except OSError as err:  # a hub id not cached while offline, or an incomplete directory
        raise could_not_load(err, name, title, source) from err
    # Generation never reads the VQ encoder that transformers' class carries; anything else missing is fatal.
    missing = sorted(k for k in info["missing_keys"] if not k.startswith("model.vqmodel."))
    if missing:
        raise ValueError(f"model {name!r}: the checkpoint at {source!r} lacks {missing}")
    if info["unexpected_keys"]:
        warnings.warn(f"model {name!r}: ignored checkpoint tensors {sorted(info['unexpected_keys'])[:8]}", stacklevel=2)
    return model.to(device), as_encoder(tokenizer), tokenizer.bos_token_id


def tokenizer_bos(tokenizer, config, name: str) -> int:
    """The BOS id the official prompts start with: the tokenizer's (`<s>`), as `load_chameleon` takes
    it; for a bare callable str -> ids, the id of `<s>` in the config's vocabulary_map. Never the
    config's `bos_token_id`: in the released Anole config that is the pad token."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None:
        return int(bos)
    vmap = dict(config.vocabulary_map or {})
    if BOS_TOKEN not in vmap:
        raise ValueError(
            f"model {name!r}: no BOS id: the tokenizer has no bos_token_id and the vocabulary_map no {BOS_TOKEN!r}"
        )
    return int(vmap[BOS_TOKEN])


# -- the adapter ----------------------------------------------------------------------------------
class ChameleonAdapter(CausalLMAdapter):
    """Protocol plumbing for Chameleon text-to-image models. A model is this class plus its constants
    (`title`, `grid_px`, its question template and defaults) and its layout: `image_layout`, the hook
    that lays out a `height` x `width` image given in units of `grid_px` pixels. A subclass restates
    `__init__` only for its defaults: the config check and Hydra read each class's own signature."""

    title = "Chameleon"
    grid_px: int  # pixels per unit of the image grid `image_layout` takes
    capabilities = frozenset({WINDOW, CUSTOM_MASK, CODE_EMBEDDINGS, FEATURES})
    vocab: ChameleonVocab
    vqgan: ChameleonVQGAN | None
    grid: tuple[int, int]  # (height, width) of the image in units of `grid_px`

    def __init__(
        self,
        weights: str,
        vqgan: str | None,
        name: str,
        device: str,
        resolution: int,
        dtype: str | None,
        trust_remote_code: bool,
        prompt_template: str,
    ) -> None:
        """Load the checkpoint `weights` for square images of `resolution` pixels."""
        if resolution < self.grid_px or resolution % self.grid_px:
            raise ValueError(f"model.adapter.resolution={resolution} must be a positive multiple of {self.grid_px}")
        dev = torch.device(device)
        model, encode, bos = load_chameleon(weights, name, self.title, dev, dtype, trust_remote_code)
        side = resolution // self.grid_px
        self._init(model, encode, side, side, self.vqgan_from(vqgan, name, dev), dev, name, prompt_template, bos)

    def _init(
        self,
        model: torch.nn.Module,
        encode: TextEncoder,
        height: int,
        width: int,
        vqgan: ChameleonVQGAN | None,
        device: torch.device,
        name: str,
        prompt_template: str,
        bos: int | None,
    ) -> None:
        """Set up around a built model, for a `height` x `width` image in units of `grid_px`; `bos`:
        the tokenizer's BOS id, which the official prompts use (None: the config's)."""
        vocab = ChameleonVocab.from_config(model.config, name, bos)
        self.grid = (height, width)
        layout = self.image_layout(vocab, height, width, name)
        self._setup(model, encode, vocab, layout, vqgan, device, name, prompt_template)

    def image_layout(self, vocab: ChameleonVocab, height: int, width: int, name: str) -> ImageLayout:
        """The layout hook: the generated stream of a `height` x `width` image (units of `grid_px`)."""
        raise NotImplementedError(f"{type(self).__name__} lays out no image")

    def code_embeddings(self) -> torch.Tensor:
        """The VQGAN codebook entry of every image code, at its vocabulary id (GSD, LANTERN-style)."""
        if self.vqgan is None:
            raise ValueError(
                f"model {self.name!r}: relaxed acceptance needs the VQGAN codebook; set model.adapter.vqgan"
            )
        return codebook_by_id(self.vqgan.quantize.embedding.weight, self.vocab.code_ids, self.layout)

    def _setup(
        self,
        model: torch.nn.Module,
        encode: TextEncoder,
        vocab: ChameleonVocab,
        layout: ImageLayout,
        vqgan: ChameleonVQGAN | None,
        device: torch.device,
        name: str,
        prompt_template: str,
    ) -> None:
        self.name, self.device, self.encode = name, device, encode
        self.model = model.eval().to(device)
        self.vocab, self.layout = vocab, layout
        self.prompt_template = prompt_template
        self.vqgan = vqgan.eval().to(device) if vqgan is not None else None
        self.max_positions = int(model.config.max_position_embeddings)
        code_of = torch.full((self.vocab.vocab_size,), -1, dtype=torch.long)
        code_of[self.vocab.code_ids] = torch.arange(len(self.vocab.code_ids))
        self._code_of_id = code_of  # vocabulary id -> VQ code index (-1 for other ids)
        if vqgan is not None and vqgan.cfg.n_embed != len(self.vocab.code_ids):
            raise ValueError(
                f"model {name!r}: the VQGAN has {vqgan.cfg.n_embed} codes, the vocabulary {len(self.vocab.code_ids)}"
            )

    @staticmethod
    def vqgan_from(vqgan: str | None, name: str, device: torch.device) -> ChameleonVQGAN | None:
        """The VQGAN in directory `vqgan`; None (with a warning) when the config leaves it null."""
        if vqgan is None:
            warnings.warn(
                f"model {name!r}: `{VQGAN_KEY}` is null, so generated tokens cannot be decoded to images", stacklevel=4
            )
            return None
        return load_vqgan(vqgan, device=device)

    # -- prompts ---------------------------------------------------------------------------------
    def question(self, text: str) -> str:
        """The user turn for a caption; subclasses fill in more fields of their template."""
        return self.prompt_template.format(text=text)

    def row_ids(self, text: str) -> list[int]:
        """One conditional prompt row: BOS, the question, end-of-turn."""
        return [self.vocab.bos, *[int(i) for i in self.encode(self.question(text))], self.vocab.end_of_turn]

    def prompt_batch(self, prompts: Sequence[Prompt], with_uncond: bool) -> tuple[torch.Tensor, list[int]]:
        """Conditional rows, then (with CFG) one `[end-of-turn]` row per prompt: SJD's
        unconditional context (module docstring). Left-padded with the pad id (holes in the cache)."""
        rows = [self.row_ids(p.text) for p in prompts]
        if with_uncond:
            rows += [[self.vocab.end_of_turn]] * len(prompts)
        width = max(len(r) for r in rows)
        pad = self.model.config.pad_token_id
        pad = self.vocab.end_of_turn if pad is None else int(pad)  # never attended: any valid id does
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
        return ids, [len(r) for r in rows]

    def prompt_ids(self, prompts: Sequence[Prompt], with_uncond: bool) -> torch.Tensor:
        return self.prompt_batch(prompts, with_uncond)[0]

    def check_prompts(self, prompts: Sequence[Prompt]) -> None:
        super().check_prompts(prompts)
        for p in prompts:
            n = len(self.row_ids(p.text)) + self.layout.n_tokens
            if n > self.max_positions:
                raise ValueError(
                    f"prompt {p.prompt_id!r} is too long for {self.name}: {n} positions with the image, "
                    f"the model takes {self.max_positions}"
                )

    # -- images ----------------------------------------------------------------------------------
    def image_codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """[B, n_tokens] generated ids -> [B, height, width] VQ code indices (specials dropped)."""
        layout = self.layout
        if tokens.dim() != 2 or tokens.shape[1] != layout.n_tokens:
            raise ValueError(f"{self.name}: expected [B, {layout.n_tokens}] tokens, got {tuple(tokens.shape)}")
        free = (layout.forced < 0).nonzero().flatten()
        codes = self._code_of_id[tokens.cpu()[:, free].clamp(0, self.vocab.vocab_size - 1)]
        if (codes < 0).any():
            raise ValueError(f"{self.name}: a code position holds an id that is not an image code")
        return codes.reshape(len(tokens), layout.height, layout.width)

    @torch.no_grad()
    def decode_images(self, tokens: torch.Tensor, chunk: int = 4) -> np.ndarray:
        """[B, n_tokens] -> [B, H, W, 3] uint8: VQGAN pixels in [-1, 1] clamped and mapped to
        [0, 255] with truncation, as Chameleon's `_pil_from_chw_tensor` does."""
        if self.vqgan is None:
            raise FileNotFoundError(
                f"model {self.name!r}: no VQGAN to decode images. Set `{VQGAN_KEY}` to the directory holding "
                "Chameleon's vqgan.yaml and vqgan.ckpt."
            )
        images = []
        for part in self.image_codes(tokens).split(chunk):
            pixels = self.vqgan.decode_codes(part.to(self.device)).float().clamp(-1, 1)
            images.append(((pixels + 1) / 2 * 255).to(torch.uint8).permute(0, 2, 3, 1).cpu())
        return torch.cat(images).numpy()
