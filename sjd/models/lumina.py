"""Lumina-mGPT 7B (`Alpha-VLLM/Lumina-mGPT-7B-768`), a Chameleon model, through transformers' classes.

Prompt, as the official Lumina-mGPT inference solver (`FlexARItemProcessor` + `Conversation`) and
SJD's `test_lumina_mgpt.py` build it for one question with the answer left to the model:

    BOS  "Generate an image of {W}x{H} according to the following prompt:\n{caption}"  <reserved08706>

(W, H in pixels; `<reserved08706>` is the end-of-turn that closes the user turn.)

Layout, as the official `MultiModalLogitsProcessor` forces it and `decode_image` reads it back:

    <racm3:break>  <h size>  <w size>  h_lat x ( w_lat codes  <reserved08799> )  <eoss>  <reserved08706>

The size tokens are `<reserved{8800 + grids}>` with one grid = 32 px (2 x 2 codes); h_lat = 2 *
h_grids codes of 16 px each. At 768 px: 24 grids, 48 x 48 codes, 3 + 48 * 49 + 2 = 2357 tokens,
the SJD paper's "2357 steps". Begin-of-image, the two size tokens, every end-of-line, end-of-image
and the final end-of-turn are forced; code positions allow exactly the 8192 image-code ids.

CFG: SJD's batched construction (sjd.models.chameleon): the unconditional row of a prompt is its
final end-of-turn token followed by the generated tokens, at positions 0, 1, 2, ...; both rows
run in one forward for AR and every speculative decoder. (Upstream Lumina-mGPT instead runs a
second unbatched forward whose context starts at begin-of-image, which gives a different image
distribution, docs/algorithms.md §1.4, so one construction is pinned for all decoders.)

Checkpoints: the published repos are transformers-format Chameleon checkpoints whose q/k-norm
tensors keep Chameleon's [model-parallel shards, head_dim] shape; they are mapped onto
transformers' [heads, head_dim] on load. Images decode through our Chameleon VQGAN
(`model.adapter.vqgan`: the directory with Chameleon's vqgan.yaml / vqgan.ckpt).
"""

from __future__ import annotations

import torch

from sjd.models.chameleon import ChameleonAdapter, ChameleonVocab, as_encoder, chameleon_layout, tokenizer_bos
from sjd.models.nets.chameleon_vqgan import ChameleonVQGAN
from sjd.types import ImageLayout

QUESTION = "Generate an image of {width}x{height} according to the following prompt:\n{text}"
END_OF_LINE = "<reserved08799>"
GRID_PX = 32  # pixels per size-token grid: 2 x 2 codes of 16 px


def size_token(grids: int) -> str:
    return f"<reserved{8800 + grids:05d}>"


def lumina_layout(vocab: ChameleonVocab, h_grids: int, w_grids: int, name: str) -> ImageLayout:
    prefix = [vocab.image_start, vocab.id_of(size_token(h_grids), name), vocab.id_of(size_token(w_grids), name)]
    suffix = [vocab.image_end, vocab.end_of_turn]
    return chameleon_layout(vocab, 2 * h_grids, 2 * w_grids, prefix, suffix, vocab.id_of(END_OF_LINE, name))


class LuminaAdapter(ChameleonAdapter):
    """Lumina-mGPT: question + end-of-turn in, begin-of-image ... end-of-turn out (module docstring)."""

    title = "Lumina-mGPT"
    official_schedule = "lumina"
    grid_px = GRID_PX  # the grid is the size tokens' (2 x 2 codes a unit)

    def __init__(
        self,
        weights: str = "Alpha-VLLM/Lumina-mGPT-7B-768",
        vqgan: str | None = None,
        name: str = "lumina",
        device: str = "cpu",
        resolution: int = 768,
        dtype: str | None = "auto",
        trust_remote_code: bool = False,
        prompt_template: str = QUESTION,
    ) -> None:
        # The same signature as anole.py's on purpose: only the defaults differ (Lumina-mGPT's checkpoint, resolution
        # and name), which a Hydra config and a user reading `help()` see here; the work is the Chameleon family's.
        super().__init__(weights, vqgan, name, device, resolution, dtype, trust_remote_code, prompt_template)

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        tokenizer,
        h_grids: int,
        w_grids: int,
        vqgan: ChameleonVQGAN | None = None,
        device: str = "cpu",
        name: str = "lumina",
        prompt_template: str = QUESTION,
    ) -> LuminaAdapter:
        """Wrap a built `ChameleonForConditionalGeneration` (e.g. a tiny random one) with a tokenizer
        or a callable str -> ids, for an image of `h_grids` x `w_grids` 32-px grids."""
        self = cls.__new__(cls)
        dev = torch.device(device)
        bos = tokenizer_bos(tokenizer, model.config, name)  # as the loader: the tokenizer's <s>, not the config's
        self._init(model, as_encoder(tokenizer), h_grids, w_grids, vqgan, dev, name, prompt_template, bos)
        return self

    def image_layout(self, vocab: ChameleonVocab, height: int, width: int, name: str) -> ImageLayout:
        return lumina_layout(vocab, height, width, name)

    def question(self, text: str) -> str:
        h_grids, w_grids = self.grid
        return self.prompt_template.format(text=text, width=w_grids * GRID_PX, height=h_grids * GRID_PX)
