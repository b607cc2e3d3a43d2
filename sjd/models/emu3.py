"""Adapter for Emu3-Gen through transformers' own Emu3 classes (`Emu3ForConditionalGeneration`).

Prompt (what the model reads before the decoder starts), as Emu3's generation processor builds it
(transformers `Emu3Processor(return_for_image_generation=True)`, and the original BAAI `mode="G"`
processor):

    BOS  text  <|image start|>  "{h}*{w}"  <|image token|>

where `text` is the caption followed by the official positive suffix (" masterpiece, film
grained, best quality.") and "{h}*{w}" is the code grid written as ordinary text tokens: the
image-size metadata. `<|image start|>` and the size are therefore part of the prompt, not
generated.

Layout (the generated stream, position 0 = first generated token): `h` rows of `w` image codes,
each row closed by end-of-line `<|extra_200|>`, then end-of-frame `<|extra_201|>`, end-of-image
`<|image end|>` and EOS: `h * (w + 1) + 3` tokens (8193 for the 720 px, 90 x 90 default). This is
the sequence the official `prefix_allowed_tokens_fn` of Emu3 forces, and the one
`decode_image_tokens` reads back (it drops the last 3 tokens and the end-of-line column).
End-of-line, end-of-frame, end-of-image and EOS are grammar-forced; every other position allows
exactly the `<|visual token NNNNNN|>` ids.

CFG: the unconditional row is the official Emu3 negative prompt ("lowres, bad anatomy, ...",
without the positive suffix) behind the same BOS and followed by the same image prefix, exactly
as the official Emu3 generation script and SJD's Emu3 script build it (docs/algorithms.md §1.3, §1.4).
Conditional and negative prompts differ in length, so the rows are left-padded to one width;
the ragged cache treats pad slots as holes and numbers each row's positions from its first real
token (what a padded `generate` computes from the attention mask). Both branches then run as
one batched forward, the same for AR and every speculative decoder. Guidance is applied by the
shared pipeline on raw logits, `uncond + s * (cond - uncond)`. The library applies it to
log-softmaxed logits, which differs only by a constant per row: the same distribution and the
same arg-max.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sjd.models.base import codebook_by_id
from sjd.models.causal_lm import CausalLMAdapter
from sjd.models.loading import WEIGHTS_KEY, TextEncoder, as_encoder, could_not_load, resolve_checkpoint, torch_dtype
from sjd.types import CODE_EMBEDDINGS, CUSTOM_MASK, FEATURES, WINDOW, ImageLayout, Prompt

# Official Emu3 sampling prompts (baaivision/Emu3 README / image_generation.py; SJD's test_emu3.py).
POSITIVE_SUFFIX = " masterpiece, film grained, best quality."
NEGATIVE_PROMPT = (
    "lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, "
    "worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, blurry."
)

TITLE = "Emu3-Gen"

# Token names in Emu3's vocabulary (config.vocabulary_map).
IMAGE_START = "<|image start|>"
IMAGE_WRAPPER = "<|image token|>"  # closes the image prefix; the codes follow it
IMAGE_END = "<|image end|>"
END_OF_LINE = "<|extra_200|>"
END_OF_FRAME = "<|extra_201|>"
VISUAL_TOKEN = re.compile(r"^<\|visual token (\d{6})\|>$")


@dataclass(frozen=True)
class Emu3Vocab:
    """The ids the adapter needs, read from the model config's vocabulary map."""

    bos: int
    eos: int
    pad: int
    image_start: int
    image_wrapper: int
    image_end: int
    eol: int
    eof: int
    code_ids: torch.Tensor  # [codebook] long: the vocabulary id of VQ code i
    vocab_size: int  # rows of the LM head

    @classmethod
    def from_config(cls, config) -> Emu3Vocab:
        vmap, text = config.vocabulary_map, config.get_text_config()
        if not vmap:
            raise ValueError("Emu3 config has no vocabulary_map: not a transformers Emu3 checkpoint")
        missing = [t for t in (IMAGE_START, IMAGE_WRAPPER, IMAGE_END, END_OF_LINE, END_OF_FRAME) if t not in vmap]
        if missing:
            raise ValueError(f"Emu3 vocabulary_map lacks the special tokens {missing}")
        codes = {int(m.group(1)): i for name, i in vmap.items() if (m := VISUAL_TOKEN.match(name))}
        if sorted(codes) != list(range(len(codes))) or not codes:
            raise ValueError("Emu3 vocabulary_map: visual tokens must be numbered 0..N-1")
        eos = text.eos_token_id[0] if isinstance(text.eos_token_id, list) else text.eos_token_id
        return cls(
            bos=int(text.bos_token_id),
            eos=int(eos),
            pad=int(text.pad_token_id),
            image_start=vmap[IMAGE_START],
            image_wrapper=vmap[IMAGE_WRAPPER],
            image_end=vmap[IMAGE_END],
            eol=vmap[END_OF_LINE],
            eof=vmap[END_OF_FRAME],
            code_ids=torch.tensor([codes[i] for i in range(len(codes))], dtype=torch.long),
            vocab_size=int(text.vocab_size),
        )


def emu3_layout(vocab: Emu3Vocab, height: int, width: int) -> ImageLayout:
    """h rows of (w codes + EOL), then EOF, EOI, EOS; codes free, the rest forced."""
    stride = width + 1
    body = height * stride
    forced = torch.full((body + 3,), -1, dtype=torch.long)
    forced[width:body:stride] = vocab.eol
    forced[body], forced[body + 1], forced[body + 2] = vocab.eof, vocab.image_end, vocab.eos
    free = torch.zeros(vocab.vocab_size, dtype=torch.bool)
    free[vocab.code_ids] = True
    return ImageLayout(
        n_tokens=body + 3,
        height=height,
        width=width,
        row_stride=stride,
        first_code=0,
        forced=forced,
        free_tokens=free,
        vocab_size=vocab.vocab_size,
    )


class Emu3Adapter(CausalLMAdapter):
    """Emu3-Gen: text prompt + image-size prefix in, h x (w + EOL) codes + EOF, EOI, EOS out."""

    capabilities = frozenset({WINDOW, CUSTOM_MASK, CODE_EMBEDDINGS, FEATURES})
    official_schedule = "emu3"

    def code_embeddings(self) -> torch.Tensor:
        """The VQ codebook entry of every image code, at its vocabulary id (GSD, LANTERN-style)."""
        return codebook_by_id(self.model.model.vqmodel.quantize.embedding.weight, self.vocab.code_ids, self.layout)

    def __init__(
        self,
        weights: str = "BAAI/Emu3-Gen-hf",
        device: str = "cpu",
        name: str = "emu3",
        resolution: int = 720,
        dtype: str = "auto",
        trust_remote_code: bool = False,
        negative_prompt: str = NEGATIVE_PROMPT,
        positive_suffix: str = POSITIVE_SUFFIX,
    ) -> None:
        source, local = resolve_checkpoint(weights, name, TITLE, hub_example="BAAI/Emu3-Gen-hf")
        dev = torch.device(device)
        weights_dtype = torch_dtype(dtype, dev)
        from transformers import AutoConfig, AutoTokenizer, Emu3Config, Emu3ForConditionalGeneration

        load = {"local_files_only": local, "trust_remote_code": bool(trust_remote_code)}
        try:
            config = AutoConfig.from_pretrained(source, **load)
            if not isinstance(config, Emu3Config):
                raise ValueError(
                    f"model {name!r}: {source!r} is a {type(config).__name__} checkpoint, not transformers' Emu3 "
                    f"format; set `{WEIGHTS_KEY}` to the converted checkpoint (e.g. BAAI/Emu3-Gen-hf)"
                )
            factor = 2 ** (len(config.vq_config.channel_multiplier) - 1)  # the VQ's spatial downsampling
            if resolution < factor or resolution % factor:
                raise ValueError(f"model.adapter.resolution={resolution} must be a multiple of the VQ factor {factor}")
            model = Emu3ForConditionalGeneration.from_pretrained(
                source, config=config, dtype=weights_dtype, use_safetensors=True, **load
            )
            tokenizer = AutoTokenizer.from_pretrained(source, **load)
        except OSError as err:  # a hub id not cached while offline, or an incomplete directory
            raise could_not_load(err, name, TITLE, source) from err
        self._setup(model, as_encoder(tokenizer), resolution // factor, resolution // factor, dev, name)
        self.negative_prompt, self.positive_suffix = negative_prompt, positive_suffix

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        tokenizer,
        height: int,
        width: int,
        device: str = "cpu",
        name: str = "emu3",
        negative_prompt: str = NEGATIVE_PROMPT,
        positive_suffix: str = POSITIVE_SUFFIX,
    ) -> Emu3Adapter:
        """Wrap an already built `Emu3ForConditionalGeneration` (e.g. a tiny random one) with a
        tokenizer or a callable str -> ids, for an `height` x `width` code grid."""
        self = cls.__new__(cls)
        self._setup(model, as_encoder(tokenizer), height, width, torch.device(device), name)
        self.negative_prompt, self.positive_suffix = negative_prompt, positive_suffix
        return self

    def _setup(
        self, model: torch.nn.Module, encode: TextEncoder, height: int, width: int, device: torch.device, name: str
    ) -> None:
        if height < 1 or width < 1:
            raise ValueError(f"Emu3 code grid must be at least 1 x 1, got {height} x {width}")
        self.name, self.device, self.encode = name, device, encode
        self.model = model.eval().to(device)
        self.vocab = Emu3Vocab.from_config(model.config)
        self.height, self.width = height, width
        self.layout = emu3_layout(self.vocab, height, width)
        self.max_positions = int(model.config.get_text_config().max_position_embeddings)

    # -- prompts ---------------------------------------------------------------------------------
    def row_ids(self, text: str) -> list[int]:
        """One prompt row: BOS, text, image start, "{h}*{w}", image wrapper. Special tokens are
        split out before BPE, so encoding the pieces equals encoding the processor's string."""
        size = self.encode(f"{self.height}*{self.width}")
        v = self.vocab
        return [v.bos, *self.encode(text), v.image_start, *size, v.image_wrapper]

    def check_prompts(self, prompts: Sequence[Prompt]) -> None:
        super().check_prompts(prompts)
        for p in prompts:
            n = len(self.row_ids(p.text + self.positive_suffix)) + self.layout.n_tokens
            if n > self.max_positions:
                raise ValueError(
                    f"prompt {p.prompt_id!r} is too long for {self.name}: {n} positions with the image, "
                    f"the model was trained on {self.max_positions}"
                )

    def prompt_batch(self, prompts: Sequence[Prompt], with_uncond: bool) -> tuple[torch.Tensor, list[int]]:
        rows = [self.row_ids(p.text + self.positive_suffix) for p in prompts]
        if with_uncond:
            rows += [self.row_ids(self.negative_prompt)] * len(prompts)
        width = max(len(r) for r in rows)
        ids = torch.tensor([[self.vocab.pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
        return ids, [len(r) for r in rows]

    def prompt_ids(self, prompts: Sequence[Prompt], with_uncond: bool) -> torch.Tensor:
        """Left-padded rows; their lengths come from `prompt_batch`."""
        return self.prompt_batch(prompts, with_uncond)[0]

    # -- images ----------------------------------------------------------------------------------
    @torch.no_grad()
    def decode_images(self, tokens: torch.Tensor) -> np.ndarray:
        """[B, n_tokens] -> [B, H, W, 3] uint8 through the Emu3 VQ decoder, one image at a time."""
        if tokens.shape[-1] != self.layout.n_tokens:
            raise ValueError(f"{self.name}: expected {self.layout.n_tokens} tokens per image, got {tokens.shape[-1]}")
        images = []
        for row in tokens.to(self.device):
            pixels = self.model.model.decode_image_tokens(image_tokens=row[None], height=self.height, width=self.width)
            # The VQ decoder's output range is [-1, 1] (what Emu3ImageProcessor.postprocess expects).
            pixels = ((pixels.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
            images.append(pixels[0].permute(1, 2, 0).cpu().numpy())
        return np.stack(images)
