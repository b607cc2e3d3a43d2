"""Anole 7B (`leloy/Anole-7b-v0.1-hf`), a Chameleon model, through transformers' classes.

Prompt, as SJD's Anole path builds it (`get_anole_forward_func`: "Generate an image of " + caption
through the Chameleon processor, which adds BOS and appends the separator `<reserved08706>`):

    BOS  "Generate an image of {caption}"  <reserved08706>

(GAIR-NLP's own text2image.py likewise closes the instruction with the end-of-turn sentinel.)

Layout, as transformers' "image-only" generation mode constrains it (`max_new_tokens` 1026):

    <racm3:break>  32 x 32 codes (raster order, no end-of-line)  <eoss>

1026 tokens at 512 px (16 px per code); begin- and end-of-image are forced, code positions allow
exactly the 8192 image-code ids. With no end-of-line token PJD anchors a new row on a draft of the
row above's last code (sjd/decoders/pjd.py).

CFG: SJD's batched construction, as for Lumina-mGPT (sjd.models.chameleon; SJD runs Anole through
the same sampler). Images decode through our Chameleon VQGAN: Anole reuses Chameleon's image
tokenizer unchanged, so `model.adapter.vqgan` is the same vqgan.yaml / vqgan.ckpt directory.
"""

from __future__ import annotations

import torch

from sjd.models.chameleon import ChameleonAdapter, ChameleonVocab, as_encoder, chameleon_layout, tokenizer_bos
from sjd.models.nets.chameleon_vqgan import ChameleonVQGAN
from sjd.types import ImageLayout

QUESTION = "Generate an image of {text}"
CODE_PX = 16  # pixels per VQGAN code


def anole_layout(vocab: ChameleonVocab, height: int, width: int) -> ImageLayout:
    return chameleon_layout(vocab, height, width, [vocab.image_start], [vocab.image_end])


class AnoleAdapter(ChameleonAdapter):
    """Anole: instruction + end-of-turn in, begin-of-image, codes, end-of-image out."""

    title = "Anole"
    official_schedule = "anole"
    grid_px = CODE_PX  # the grid is the code grid

    def __init__(
        self,
        weights: str = "leloy/Anole-7b-v0.1-hf",
        vqgan: str | None = None,
        name: str = "anole",
        device: str = "cpu",
        resolution: int = 512,
        dtype: str | None = "auto",
        trust_remote_code: bool = False,
        prompt_template: str = QUESTION,
    ) -> None:
        # The same signature as lumina.py's on purpose: only the defaults differ (Anole's checkpoint, resolution and
        # name), which a Hydra config and a user reading `help()` see here; the work is the Chameleon family's.
        super().__init__(weights, vqgan, name, device, resolution, dtype, trust_remote_code, prompt_template)

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        tokenizer,
        height: int,
        width: int,
        vqgan: ChameleonVQGAN | None = None,
        device: str = "cpu",
        name: str = "anole",
        prompt_template: str = QUESTION,
    ) -> AnoleAdapter:
        """Wrap a built `ChameleonForConditionalGeneration` (e.g. a tiny random one) with a tokenizer
        or a callable str -> ids, for a `height` x `width` code grid. BOS is the tokenizer's (`<s>`; for a
        callable, `<s>` in the vocabulary_map), as the loader takes it, never the config's `bos_token_id`."""
        self = cls.__new__(cls)
        bos = tokenizer_bos(tokenizer, model.config, name)  # as the loader: the tokenizer's <s>, not the config's
        self._init(model, as_encoder(tokenizer), height, width, vqgan, torch.device(device), name, prompt_template, bos)
        return self

    def image_layout(self, vocab: ChameleonVocab, height: int, width: int, name: str) -> ImageLayout:
        return anole_layout(vocab, height, width)
