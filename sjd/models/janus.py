"""Janus-Pro (1B, 7B) through transformers' `JanusForConditionalGeneration`.

Generation path. Janus generates images through its own input and output layers, not the text
ones, around the shared Llama trunk (`model.model.language_model`):
- the prompt (chat template, then the begin-of-image tag) goes through the *text* embeddings;
- every generated image code goes through the *generation* embeddings and the generation aligner
  (`prepare_embeddings_for_image_generation`);
- the trunk's hidden states go through the *generation head*, whose logits cover the image
  codebook only (16384 codes); the text `lm_head` is never used.
The prompt ends with begin-of-image, so generated position 0 is the first image code and the
stream is the 24x24 = 576 codes in raster order (384 px, 16 px per code): no end-of-line, no
end-of-image, nothing forced, every position free over the whole codebook. Token ids in the
stream are codebook indices, which is what the VQ decoder takes.

CFG. The unconditional row is built exactly as transformers' `generate(generation_mode="image")`
builds it (and as DeepSeek's reference script does): the conditional prompt with every token that
is neither BOS nor begin-of-image replaced by the pad token. The pads are real, attended tokens
(not masked), so both rows have the same length and the same positions. Building it the
references' way keeps our AR baseline identical to the model's own sampler (the tests check it
token for token against transformers' generate). The two rows run as one batch and are
mixed by the shared pipeline as `uncond + s * (cond - uncond)` on raw logits, the same formula as
transformers' `ClassifierFreeGuidanceLogitsProcessor` and DeepSeek's reference loop.

Batches. Prompts of different lengths are left-padded to the longest; those padding slots are
holes in the ragged cache (never attended) and every row's positions start at 0, so a prompt's
logits do not depend on the batch it is in. (They are not the unconditional row's pad tokens,
which are attended.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from sjd.models.base import codebook_by_id
from sjd.models.causal_lm import CausalLMAdapter, RunOutput, rope_theta
from sjd.models.loading import CHECKPOINT_FILES, could_not_load, resolve_checkpoint, torch_dtype
from sjd.types import CODE_EMBEDDINGS, CUSTOM_MASK, FEATURES, WINDOW, ImageLayout, Logits, Prompt

if TYPE_CHECKING:
    from transformers import JanusProcessor, PreTrainedTokenizerBase

TITLE = "Janus-Pro"
HUB_EXAMPLE = "deepseek-community/Janus-Pro-7B"

Encoder = Callable[[str], Sequence[int]]


def processor_encoder(processor: JanusProcessor) -> Encoder:
    """Prompt text -> ids the way transformers documents Janus image generation: the chat
    template with the generation prompt, then the processor in image mode (which appends the
    begin-of-image tag)."""

    def encode(text: str) -> list[int]:
        messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
        chat = processor.apply_chat_template(messages, add_generation_prompt=True)
        return processor(text=chat, generation_mode="image", return_tensors="pt")["input_ids"][0].tolist()

    return encode


def special_ids(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase | None = None, name: str = "janus"
) -> tuple[int, int, int]:
    """(BOS, pad, begin-of-image) ids for the CFG rows, read where transformers' image generation
    reads them: the generation config's bos/pad ids and `generation_kwargs["boi_token_id"]`.
    Generation configs written by the conversion script may keep `boi_token_id` at top level, and a
    config derived from the model config has none: then the tokenizer's ids (same tokens) are used."""
    gen = model.generation_config
    bos, pad = gen.bos_token_id, gen.pad_token_id
    boi = (getattr(gen, "generation_kwargs", None) or {}).get("boi_token_id", getattr(gen, "boi_token_id", None))
    if tokenizer is not None:
        bos = tokenizer.bos_token_id if bos is None else bos
        pad = tokenizer.pad_token_id if pad is None else pad
        if boi is None and getattr(tokenizer, "boi_token", None) is not None:
            boi = tokenizer.convert_tokens_to_ids(tokenizer.boi_token)
    if bos is None or pad is None or boi is None:
        raise ValueError(
            f"model {name!r}: need the BOS, pad and begin-of-image ids for the CFG rows, got {bos}, {pad}, {boi} "
            "(from the generation config's bos_token_id, pad_token_id, generation_kwargs['boi_token_id'], or "
            "the tokenizer)"
        )
    return int(bos), int(pad), int(boi)


class JanusAdapter(CausalLMAdapter):
    """Janus-Pro text-to-image generation. Build with the constructor (a checkpoint) or with
    `from_model` (an already built `JanusForConditionalGeneration` and a prompt encoder)."""

    capabilities = frozenset({WINDOW, CUSTOM_MASK, CODE_EMBEDDINGS, FEATURES})

    def code_embeddings(self) -> torch.Tensor:
        """The generation VQ's codebook (stream ids are codebook indices) for GSD, LANTERN-style."""
        codebook = self.model.model.vqmodel.quantize.embedding.weight
        return codebook_by_id(codebook, torch.arange(codebook.shape[0]), self.layout)

    def __init__(
        self,
        weights: str,
        name: str = "janus",
        device: str = "cpu",
        dtype: str | None = None,
        resolution: int | None = 384,
        trust_remote_code: bool = False,
        attn_implementation: str | None = None,
    ) -> None:
        from transformers import JanusForConditionalGeneration, JanusProcessor
        from transformers.utils import is_accelerate_available

        dev = torch.device(device)
        source, local = resolve_checkpoint(
            weights, name, TITLE, contents=f"{CHECKPOINT_FILES}, processor files", hub_example=HUB_EXAMPLE
        )
        weights_dtype = torch_dtype(dtype, dev)
        kwargs = {"local_files_only": local, "trust_remote_code": trust_remote_code}
        try:
            processor = JanusProcessor.from_pretrained(source, **kwargs)
            extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
            if is_accelerate_available():  # straight onto the device; without accelerate: CPU, then moved
                extra["device_map"] = str(dev)
            model = JanusForConditionalGeneration.from_pretrained(
                source, dtype=weights_dtype, use_safetensors=True, **kwargs, **extra
            )
        except OSError as err:  # hub id not cached while offline, or an incomplete directory
            raise could_not_load(err, name, TITLE, source) from err
        self._setup(model, processor_encoder(processor), name, dev, resolution, processor.tokenizer)

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        encode: Encoder,
        name: str = "janus",
        device: str | torch.device | None = None,
        resolution: int | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> JanusAdapter:
        """Wrap a built `JanusForConditionalGeneration` (e.g. a tiny random one in tests);
        `encode` maps a prompt text to ids ending with begin-of-image (see `processor_encoder`);
        `tokenizer`, if given, supplies special ids the generation config lacks."""
        self = cls.__new__(cls)
        dev = torch.device(device) if device is not None else next(model.parameters()).device
        self._setup(model, encode, name, dev, resolution, tokenizer)
        return self

    def _setup(
        self,
        model: torch.nn.Module,
        encode: Encoder,
        name: str,
        device: torch.device,
        resolution: int | None,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        self.name, self.device, self.encode = name, device, encode
        self.model = model.eval().to(device)
        cfg = model.config
        self.bos_id, self.pad_id, self.boi_id = special_ids(model, tokenizer, name)

        side = int(cfg.vq_config.num_patches)  # codes per row and per column
        n_tokens = int(cfg.vision_config.num_image_tokens)
        if n_tokens != side * side:
            raise ValueError(f"model {name!r}: {n_tokens} image tokens is not a {side}x{side} grid")
        self.pixels = side * 2 ** (len(cfg.vq_config.channel_multiplier) - 1)  # VQ decoder upsampling
        if resolution is not None and resolution != self.pixels:
            raise ValueError(
                f"model.adapter.resolution={resolution}, but this checkpoint generates {self.pixels} px images "
                f"({side}x{side} codes)"
            )
        vocab = int(cfg.vq_config.num_embeddings)
        self.layout = ImageLayout(
            n_tokens=n_tokens,
            height=side,
            width=side,
            row_stride=side,
            first_code=0,
            forced=torch.full((n_tokens,), -1, dtype=torch.long),
            free_tokens=torch.ones(vocab, dtype=torch.bool),
            vocab_size=vocab,
        )

    # -- prompts ------------------------------------------------------------------------------
    def prompt_rows(self, prompts: Sequence[Prompt], with_uncond: bool) -> list[list[int]]:
        """Conditional rows, then (with CFG) their unconditional rows, unpadded."""
        rows = []
        for p in prompts:
            ids = [int(i) for i in self.encode(p.text)]
            if not ids or ids[-1] != self.boi_id:
                raise ValueError(f"prompt {p.prompt_id!r}: encoded prompt does not end with begin-of-image")
            rows.append(ids)
        if with_uncond:
            rows += [self.uncond_row(r) for r in rows[: len(prompts)]]
        return rows

    def uncond_row(self, ids: Sequence[int]) -> list[int]:
        """transformers' construction: every token but BOS and begin-of-image becomes pad."""
        return [i if i in (self.bos_id, self.boi_id) else self.pad_id for i in ids]

    def prompt_ids(self, prompts: Sequence[Prompt], with_uncond: bool) -> torch.Tensor:
        """[B or 2B, T] ids, left-padded with the pad id to the longest row (see `prefill`)."""
        return self._left_pad(self.prompt_rows(prompts, with_uncond))

    def _left_pad(self, rows: list[list[int]]) -> torch.Tensor:
        width = max(len(r) for r in rows)
        return torch.tensor([[self.pad_id] * (width - len(r)) + r for r in rows], dtype=torch.long)

    def check_prompts(self, prompts: Sequence[Prompt]) -> None:
        super().check_prompts(prompts)
        self.prompt_rows(prompts, with_uncond=False)

    # -- model calls ----------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, prompts: Sequence[Prompt], with_uncond: bool) -> Logits:
        rows = self.prompt_rows(prompts, with_uncond)
        ids = self._left_pad(rows).to(self.device)
        self._with_uncond = with_uncond
        self._cache = cache = self.new_cache(self.model.config, [len(r) for r in rows], int(with_uncond))
        kwargs = cache.prefill_kwargs(self.device)  # left padding: pad slots are holes, positions start at 0 per row
        embeds = self.model.get_input_embeddings()(ids)
        out = self._logits(embeds, cache=cache.cache, use_cache=True, logits_to_keep=1, **kwargs)
        return self._output(out, ids.new_zeros(ids.shape), [len(r) for r in rows])  # text ids: not the drafter's codes

    def _run(self, ids: torch.Tensor, **kwargs) -> RunOutput:
        """Generated image codes: generation embeddings + aligner in, generation head out."""
        return self._logits(self.model.prepare_embeddings_for_image_generation(ids), **kwargs)

    def _logits(self, embeds: torch.Tensor, logits_to_keep: int = 0, **kwargs) -> RunOutput:
        hidden = self._stack()(inputs_embeds=embeds, **kwargs).last_hidden_state
        return self._head_output(hidden, logits_to_keep)

    def window_stack(self) -> torch.nn.Module:
        return self.model.model.language_model

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.model.generation_head

    @torch.no_grad()
    def head(self, hidden: torch.Tensor) -> Logits:
        return self._split(self.lm_head(hidden.to(self.model.dtype)))

    def code_head(self, hidden: torch.Tensor) -> Logits:
        return self.head(hidden)  # the generation head has the image codes' rows only: nothing to cut

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden.to(self.model.dtype))  # a two-layer head over the codes alone: nothing to cut

    @torch.no_grad()
    def token_embeddings(self) -> torch.Tensor:
        """The generation embedding of every code through the aligner: what the language model reads."""
        codes = torch.arange(self.layout.vocab_size, device=self.device)
        return self.model.prepare_embeddings_for_image_generation(codes[None])[0]

    def architecture(self) -> dict:
        config = self.model.config.text_config
        arch = config.to_dict()
        arch.update(rope_theta=rope_theta(config), vocab_size=self.layout.vocab_size)
        return arch

    # -- pixels ---------------------------------------------------------------------------------
    @torch.no_grad()
    def decode_images(self, tokens: torch.Tensor, chunk: int = 8) -> np.ndarray:
        """[B, n_tokens] codes -> [B, H, W, 3] uint8 through the Janus VQ decoder; [-1, 1] maps to
        [0, 255] as in DeepSeek's reference script (clip, then truncate)."""
        images = []
        for part in tokens.long().split(chunk):
            pixels = self.model.decode_image_tokens(part.to(self.device)).float()
            images.append(((pixels + 1) / 2 * 255).clamp(0, 255).to(torch.uint8).cpu())
        return torch.cat(images).numpy()
