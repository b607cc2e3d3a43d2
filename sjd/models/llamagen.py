"""LlamaGen-XL text-to-image (FoundationVision/LlamaGen): our GPT module, T5 captions, VQ-16 decoding.

Prompt. The caption goes through flan-t5-xl's encoder the way the official T2I sample script
(`autoregressive/sample/sample_t2i.py` with `language/t5.py`) does it: tokenised with special tokens (the closing
`</s>`), padded to and truncated at `max_length = cls_token_num = 120` tokens, encoded with the padding mask.
The features are then left-padded (valid tokens rolled to the end, padding in front and zeroed) and projected by
the GPT's caption MLP into the 120 caption slots. The padding mask hides the padded caption slots from every
query (a padded slot only sees itself, so it stays finite); caption slots have no rotary rotation to depend on,
so a caption's logits do not depend on its length or its batch. Text cleaning: the official embedder cleans
captions with ftfy, BeautifulSoup and a long list of regexes (`clean_caption`); we apply only its simple branch
(`lower().strip()`). The two agree on plain captions (words, spaces, commas, a final period); captions with URLs,
HTML, unusual punctuation or letter-digit codes can reach T5 differently.

Layout. Generated position 0 is the first image code: the stream is the 32 x 32 = 1024 VQ-16 codes of a 512 px
image in raster order, with no begin- or end-of-image token and no end-of-line token. Nothing is forced and every
position is free over the whole 16384-code codebook; token ids are codebook indices (the GPT's vocabulary is the
codebook). PJD anchors a new row on a draft of the row above's last code (sjd/decoders/pjd.py).

CFG. As the official `generate`: the unconditional rows replace the caption by the learned null caption
(`cls_embedding.uncond_embedding`, projected by the same MLP), and keep the *conditional* row's caption padding
mask (the release builds both halves' masks from the same `emb_masks`). Both halves run as one batch; the shared
pipeline mixes raw logits as `uncond + s * (cond - uncond)`, the release's formula.

Cache. A `RaggedCache` over our GPT (every row's prompt is the 120 caption slots), so windows, ragged rows,
truncation and the `custom_mask` capability work as for the transformers models.

Images. Codes decode through transformers' Janus VQ model loaded from the released `vq_ds16_t2i.pt` after a key
rename (sjd/models/nets/llamagen_vq.py); [-1, 1] maps to uint8 the way the sample script's `save_image` does it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from sjd.models.base import ModelAdapter, codebook_by_id
from sjd.models.causal_lm import RaggedRows, RunOutput, pad_tree, pad_window
from sjd.models.loading import could_not_load, resolve_checkpoint, torch_dtype
from sjd.models.nets.llamagen_gpt import LlamaGenConfig, LlamaGenGPT, load_gpt
from sjd.models.nets.llamagen_vq import downsample_factor, load_vq, vq_config
from sjd.types import CODE_EMBEDDINGS, CUSTOM_MASK, FEATURES, WINDOW, ImageLayout, Logits, Prompt

GPT_KEY, VQ_KEY, T5_KEY = "model.adapter.weights", "model.adapter.vq_weights", "model.adapter.t5"
_HUB_FILE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+/[\w.-]+$")


def resolve_file(value: str | Path, name: str, key: str, what: str) -> str:
    """A local checkpoint file, or `owner/repo/file` on the hub (downloaded, or read from the local hub cache).
    Anything else is a missing file, reported with the model, the path and the config key."""
    path = Path(value).expanduser()
    if path.is_file():
        return str(path)
    text = str(value)
    fix = f"Set `{key}` to the local file, or to `owner/repo/file` on the hub (e.g. peizesun/llamagen_t2i/...)."
    looks_hub = _HUB_FILE.match(text) and not path.exists() and not Path(text.split("/")[0]).is_dir()
    if not looks_hub:
        raise FileNotFoundError(f"model {name!r}: no {what} at {path.absolute()}. {fix}")
    from huggingface_hub import hf_hub_download

    repo, filename = text.rsplit("/", 1)
    try:
        return hf_hub_download(repo_id=repo, filename=filename)
    except Exception as err:  # offline without a cached copy, unknown repo or file
        raise FileNotFoundError(
            f"model {name!r}: could not get the {what} {text!r} from the hub ({type(err).__name__}: {err}), "
            f"and there is no local file {path.absolute()}. {fix}"
        ) from err


def left_pad(features: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded T5 output [B, L, D] and mask [B, L] -> valid tokens moved to the end, padding zeroed in front
    (the sample script's left padding), and the matching bool mask."""
    valid = mask.sum(1).tolist()
    L = mask.shape[1]
    rows = [torch.cat([f[n:], f[:n]]) for f, n in zip(features, valid)]
    new_mask = torch.arange(L, device=mask.device)[None, :] >= torch.tensor([L - n for n in valid])[:, None].to(
        mask.device
    )
    return torch.stack(rows) * new_mask[..., None].to(features.dtype), new_mask


class LlamaGenAdapter(RaggedRows, ModelAdapter):
    """LlamaGen T2I. Build with the constructor (checkpoint files) or `from_parts` (built modules)."""

    prompt_rounding = 1  # every prompt is the caption's cls_token_num slots: one shape already

    capabilities = frozenset({WINDOW, CUSTOM_MASK, CODE_EMBEDDINGS, FEATURES})
    official_schedule = "llamagen"

    def code_embeddings(self) -> torch.Tensor:
        """The VQ-16 codebook (stream ids are codebook indices) for GSD, LANTERN-style."""
        codebook = self.vq.quantize.embedding.weight
        return codebook_by_id(codebook, torch.arange(codebook.shape[0]), self.layout)

    def __init__(
        self,
        weights: str = "peizesun/llamagen_t2i/t2i_XL_stage2_512.pt",
        vq_weights: str = "peizesun/llamagen_t2i/vq_ds16_t2i.pt",
        t5: str = "google/flan-t5-xl",
        name: str = "llamagen",
        device: str = "cpu",
        dtype: str | None = "auto",
        resolution: int = 512,
        gpt_model: str | Mapping = "GPT-XL",
        vq_model: str | Mapping = "VQ-16",
    ) -> None:
        from transformers import AutoTokenizer, T5EncoderModel

        dev = torch.device(device)
        weights_dtype = torch_dtype(dtype, dev)
        gpt_path = resolve_file(weights, name, GPT_KEY, "LlamaGen GPT checkpoint")
        vq_path = resolve_file(vq_weights, name, VQ_KEY, "VQ tokenizer checkpoint")
        t5_source, local = resolve_checkpoint(t5, name, "T5 encoder", T5_KEY, hub_example="google/flan-t5-xl")
        factor = downsample_factor(vq_config(vq_model, 1))
        if resolution < factor or resolution % factor:
            raise ValueError(f"model.adapter.resolution={resolution} must be a multiple of the VQ factor {factor}")
        grid = resolution // factor
        gpt = load_gpt(gpt_path, LlamaGenConfig.build(gpt_model, grid_size=grid))
        vq = load_vq(vq_path, vq_config(vq_model, grid))
        try:
            tokenizer = AutoTokenizer.from_pretrained(t5_source, local_files_only=local)
            encoder = T5EncoderModel.from_pretrained(
                t5_source, local_files_only=local, dtype=weights_dtype, use_safetensors=True
            )
        except OSError as err:  # hub id not cached while offline, or an incomplete directory
            raise could_not_load(err, name, "T5 encoder", t5_source, T5_KEY) from err
        self._setup(gpt.to(dev, weights_dtype), tokenizer, encoder, vq, name, dev)

    @classmethod
    def from_parts(
        cls,
        gpt: LlamaGenGPT,
        tokenizer,
        text_encoder: torch.nn.Module,
        vq: torch.nn.Module,
        name: str = "llamagen",
        device: str | torch.device | None = None,
    ) -> LlamaGenAdapter:
        """Wrap built modules (e.g. tiny random ones in tests): our GPT, a T5 tokenizer and encoder, a Janus VQ."""
        self = cls.__new__(cls)
        dev = torch.device(device) if device is not None else next(gpt.parameters()).device
        self._setup(gpt, tokenizer, text_encoder, vq, name, dev)
        return self

    def _setup(self, gpt: LlamaGenGPT, tokenizer, text_encoder, vq, name: str, device: torch.device) -> None:
        cfg = gpt.config
        width = int(text_encoder.config.d_model)
        if width != cfg.caption_dim:
            raise ValueError(
                f"model {name!r}: the T5 encoder gives {width}-d features, the GPT's caption projection takes "
                f"{cfg.caption_dim}-d ({T5_KEY} and {GPT_KEY} do not belong together)"
            )
        vq_grid = tuple(vq.quantize.quant_state_dims)
        if vq_grid != (cfg.grid_size, cfg.grid_size):
            raise ValueError(f"model {name!r}: the VQ decodes {vq_grid} codes, the GPT makes {cfg.grid_size}^2")
        self.name, self.device = name, device
        self.gpt = gpt.eval().to(device)
        self.tokenizer = tokenizer
        self.text_encoder = text_encoder.eval().to(device)
        self.vq = vq.eval().to(device)
        self.pixels = cfg.grid_size * downsample_factor(vq.config)
        n = cfg.n_image_tokens
        self.layout = ImageLayout(
            n_tokens=n,
            height=cfg.grid_size,
            width=cfg.grid_size,
            row_stride=cfg.grid_size,
            first_code=0,
            forced=torch.full((n,), -1, dtype=torch.long),
            free_tokens=torch.ones(cfg.vocab_size, dtype=torch.bool),
            vocab_size=cfg.vocab_size,
        )

    # -- captions -------------------------------------------------------------------------------
    @torch.no_grad()
    def encode_captions(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """T5 features [B, cls_token_num, caption_dim], left-padded with zeros, and the bool mask of real tokens."""
        tokens = self.tokenizer(
            [t.lower().strip() for t in texts],
            max_length=self.gpt.config.cls_token_num,
            padding="max_length",
            padding_side="right",  # what `left_pad` expects, whatever the saved tokenizer prefers
            truncation=True,
            return_attention_mask=True,
            add_special_tokens=True,
            return_tensors="pt",
        ).to(self.device)
        features = self.text_encoder(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
        return left_pad(features.last_hidden_state, tokens["attention_mask"].bool())

    def caption_rows(self, prompts: Sequence[Prompt], with_uncond: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Caption slot embeddings [rows, cls_token_num, dim] (conditional rows, then the null caption) and each
        row's caption mask; an unconditional row keeps its conditional row's mask, as the release does."""
        features, mask = self.encode_captions([p.text for p in prompts])
        embeds = self.gpt.caption_embeddings(features)
        if with_uncond:
            embeds = torch.cat([embeds, self.gpt.uncond_caption(len(prompts))])
            mask = torch.cat([mask, mask])
        return embeds, mask

    # -- model calls ----------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, prompts: Sequence[Prompt], with_uncond: bool) -> Logits:
        embeds, mask = self.caption_rows(prompts, with_uncond)
        self._with_uncond, self._caption_mask = with_uncond, mask
        width = self.gpt.config.cls_token_num
        self._cache = self.new_cache(None, [width] * len(embeds), int(with_uncond))
        kwargs = self._cache.prefill_kwargs(self.device)
        logits, hidden = self.gpt(
            embeds,
            positions=kwargs.get("position_ids"),
            cache=self._cache.cache,
            attention_mask=kwargs.get("attention_mask"),
            prefix_mask=mask,
            logits_to_keep=1,
            return_hidden=True,
        )
        ids = torch.zeros(
            len(embeds), width, dtype=torch.long, device=self.device
        )  # caption slots: no ids (as LANTERN)
        return self._output(RunOutput(logits, hidden), ids, [width] * len(embeds))

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, start: Sequence[int]) -> Logits:
        width = tokens.shape[1]
        tokens = pad_window(tokens, self.bucket(width))  # compile=true: a width of the compiled set
        kwargs = self._ragged().prepare(start, tokens.shape[1], self.device)
        return self._crop(self._run(tokens, **kwargs), width)

    @torch.no_grad()
    def forward_at(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        keep: torch.Tensor,
        window_mask: torch.Tensor,
        transient: torch.Tensor | None = None,
    ) -> Logits:
        width = tokens.shape[1]
        tokens, positions, window_mask, transient = pad_tree(
            tokens, positions, window_mask, transient, self.bucket(width)
        )
        return self._crop(self._run(tokens, **self._window_at(positions, keep, window_mask, transient)), width)

    def window_stack(self) -> torch.nn.Module:
        return self.gpt

    def _run(self, tokens: torch.Tensor, position_ids, attention_mask) -> Logits:
        """A window through our GPT (the compiled one under compile=true)."""
        ids = torch.cat([tokens, tokens]) if self._with_uncond else tokens
        self._in_window = True
        try:
            logits, hidden = self._stack()(
                self.gpt.tok_embeddings(ids.to(self.device)),
                positions=position_ids,
                cache=self._cache.cache,
                attention_mask=attention_mask,
                prefix_mask=self._caption_mask,
                return_hidden=True,
            )
        finally:
            self._in_window = False
        return self._output(RunOutput(logits, hidden))

    # -- the `features` capability ------------------------------------------------------------------
    @torch.no_grad()
    def head(self, hidden: torch.Tensor) -> Logits:
        return self._split(self.gpt.output(hidden.to(self.gpt.output.weight.dtype)).float())

    def token_embeddings(self) -> torch.Tensor:
        return self.gpt.tok_embeddings.weight

    def architecture(self) -> dict:
        """Our GPT's settings under transformers' names; the drafter's rotary table is the GPT's 2-D one."""
        cfg = self.gpt.config
        return {
            "model_type": "llamagen",
            "hidden_size": cfg.dim,
            "vocab_size": cfg.vocab_size,
            "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.kv_heads,
            "intermediate_size": cfg.ffn_dim,
            "rms_norm_eps": cfg.norm_eps,
            "rope_theta": cfg.rope_base,
            "grid_size": cfg.grid_size,
            "cls_token_num": cfg.cls_token_num,
        }

    # -- pixels ---------------------------------------------------------------------------------
    @torch.no_grad()
    def decode_images(self, tokens: torch.Tensor, chunk: int = 8) -> np.ndarray:
        """[B, n_tokens] codes -> [B, H, W, 3] uint8; [-1, 1] -> [0, 255] with clamping and rounding, as
        torchvision's `save_image(normalize=True, value_range=(-1, 1))` in the sample script."""
        if tokens.shape[-1] != self.layout.n_tokens:
            raise ValueError(f"{self.name}: expected {self.layout.n_tokens} codes per image, got {tokens.shape[-1]}")
        images = []
        for part in tokens.long().split(chunk):
            pixels = self.vq.decode(part.to(self.device)).float().clamp(-1, 1)
            pixels = ((pixels + 1) / 2 * 255 + 0.5).clamp(0, 255).to(torch.uint8)
            images.append(pixels.permute(0, 2, 3, 1).cpu())
        return torch.cat(images).numpy()
