"""What a decoder may ask of a model: the adapter protocol.

A decoder sees a model only through `ModelAdapter`. The adapter owns the tokenizer, the
classifier-free-guidance rows, the KV cache and the image grammar; it never samples. The
decoder owns the loop and never touches model internals. Positions are *generated*
positions: 0 is the first token the decoder produces (e.g. begin-of-image), and
`layout.n_tokens - 1` the last (end-of-image).

Cache contract, per batch row `b` (rows may be at different lengths: a ragged batch):
- after `prefill`, row b holds the prompt and no generated position;
- `forward(tokens, start)` first drops every generated position >= start[b] of row b, then
  writes `tokens[b, i]` at position `start[b] + i` and returns, for every i, the logits that
  predict position `start[b] + i + 1` given everything the row holds up to and including i;
- `truncate(lengths)` drops every generated position >= lengths[b] of row b.
So a decoder that rejects drafts simply forwards again from the last committed position.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import torch

from sjd.types import CODE_EMBEDDINGS, CUSTOM_MASK, EMBEDS, FEATURES, WINDOW, ImageLayout, Logits, Prompt


class ModelAdapter(ABC):
    """A text-to-image AR model as the decoders see it."""

    name: str
    capabilities: frozenset[str] = frozenset({WINDOW})
    layout: ImageLayout
    device: torch.device
    # Which rule of the official SJD scripts sets the Jacobi interval under decoder.schedule=official
    # (sjd.core.schedule.official_interval); `generic` for models the official code never ran.
    official_schedule: str = "generic"
    # How the checkpoint was made, where the project made it (a stand-in's training record: its recipe,
    # recipe_sha and weights_sha, scripts/train_standin.py); None for released weights. Runs record it.
    training_record: dict | None = None
    cache_kind: str = "dynamic"  # the KV cache it decodes with (use_cache); RaggedRows adapters also take static

    def networks(self) -> dict[str, torch.nn.Module]:
        """The networks the adapter decodes and renders with, by attribute name (the language model, its image
        tokenizer, a text encoder): what a run's weights hash covers. Adapters holding them elsewhere override."""
        return {name: value for name, value in vars(self).items() if isinstance(value, torch.nn.Module)}

    def timed_by(self, clock: object | None) -> None:
        """The forward clock of the decode that starts (sjd.decoders.base.ForwardClock), None when it ends. An
        adapter whose calls hold work that is not the timed model's (a shadowed run's stand-in, sjd/models/shadow.py)
        runs that work inside the clock's `set_aside()`; any other adapter has nothing to set aside."""
        return None

    def use_cache(self, kind: str) -> None:
        """Decode with this kind of KV cache (`dynamic` or `static`, sjd.models.causal_lm.RaggedRows) from the next
        prefill on; an adapter with a cache of its own has only that one."""
        if kind != "dynamic":
            raise ValueError(f"model {self.name!r} has no {kind!r} KV cache (cache=dynamic only)")

    @abstractmethod
    def prefill(self, prompts: Sequence[Prompt], with_uncond: bool) -> Logits:
        """Reset the cache, run the prompts (and their unconditional rows when `with_uncond`),
        and return logits [B, 1, V] predicting generated position 0."""

    @abstractmethod
    def forward(self, tokens: torch.Tensor, start: Sequence[int]) -> Logits:
        """Write `tokens` [B, W] at generated positions start[b] + i (see the module docstring)."""

    def forward_at(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        keep: torch.Tensor,
        window_mask: torch.Tensor,
        transient: torch.Tensor | None = None,
    ) -> Logits:
        """The `custom_mask` capability: write `tokens` [B, W] at arbitrary generated `positions`
        [B, W] (-1 = padding, never attended to), after dropping every cached generated position
        p of row b with `keep[b, p]` False (and any position being rewritten). Query i attends to
        the kept cached positions below positions[b, i] and to the window slots j with
        `window_mask[b, i, j]`. Logits i predict the token after positions[b, i] in raster order.
        Slots with `transient[b, i]` (optional [B, W]) are never cached: a tree decoder's
        alternative tokens share a position with the chain and must not outlive the forward."""
        raise NotImplementedError(f"model {self.name!r} does not provide the {CUSTOM_MASK!r} capability")

    def keep_slots(self, keep: torch.Tensor) -> None:
        """`custom_mask`: of the last `forward_at`'s transient slots, keep those with `keep[b, i]` ([B, W]) in
        the cache, as if they had been written as ordinary slots. A tree decoder keeps its accepted path this
        way: each node attended to its ancestors only, so on the accepted path its keys and values are those
        of the committed tokens, and the next forward needs not rewrite them."""
        raise NotImplementedError(f"model {self.name!r} does not provide the {CUSTOM_MASK!r} capability")

    # -- the `features` capability (trained drafters) ----------------------------------------------
    def head(self, hidden: torch.Tensor) -> Logits:
        """Raw logits of hidden states [R, W, H] through the target's own LM head, rows as in `Features`
        (conditional, then unconditional): what a drafter's predicted features become."""
        raise NotImplementedError(f"model {self.name!r} does not provide the {FEATURES!r} capability")

    def code_head(self, hidden: torch.Tensor) -> Logits:
        """As `head`, computing only the image codes' rows (the layout's free ids) where the head allows it; the
        other columns are zeros, which the shared pipeline never reads (at a code's position it reads the free
        columns, and it forces every other position). A drafter or heads set to `head: codes` draft through it,
        and are priced at the codes' rows of the LM head."""
        return self.head(hidden)

    def token_embeddings(self) -> torch.Tensor:
        """[V, H] the input embedding of every id the model generates: a drafter's frozen copy starts here."""
        raise NotImplementedError(f"model {self.name!r} does not provide the {FEATURES!r} capability")

    def architecture(self) -> dict:
        """What a drafter's single layer must copy, as a transformers-style config dict: `model_type` (the
        layer family: llama, chameleon or llamagen), `hidden_size`, `vocab_size`, `num_attention_heads`,
        `num_key_value_heads`, `intermediate_size`, `rms_norm_eps`, `rope_theta` (sjd.drafters.net)."""
        raise NotImplementedError(f"model {self.name!r} does not provide the {FEATURES!r} capability")

    # -- the `embeds` capability (SJD2): window inputs given as noisy token embeddings ------------
    noise_levels: int = 0  # discrete noise levels; 0 = clean, noise_levels - 1 = pure noise
    embed_dim: int = 0

    def embed(self, tokens: torch.Tensor, levels: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Input embeddings [B, W, D] of `tokens` at noise `levels` [B, W], mixing in the standard
        normal `noise` [B, W, D] the way the model was fine-tuned (its own noise schedule)."""
        raise NotImplementedError(f"model {self.name!r} does not provide the {EMBEDS!r} capability")

    def forward_embeds(self, embeds: torch.Tensor, levels: torch.Tensor, start: Sequence[int]) -> Logits:
        """As `forward`, with input embeddings (from `embed`) and their noise levels."""
        raise NotImplementedError(f"model {self.name!r} does not provide the {EMBEDS!r} capability")

    def code_embeddings(self) -> torch.Tensor:
        """The `code_embeddings` capability: [vocab, D] float, the image tokenizer's latent vector
        (its VQ codebook entry) for every free image id; rows of other ids are never read. Relaxed
        acceptance rules call codes with nearby latents "neighbours"."""
        raise NotImplementedError(f"model {self.name!r} does not provide the {CODE_EMBEDDINGS!r} capability")

    @abstractmethod
    def decode_images(self, tokens: torch.Tensor) -> np.ndarray:
        """[B, n_tokens] generated ids -> [B, H, W, 3] uint8 images."""

    def check_prompts(self, prompts: Sequence[Prompt]) -> None:
        """Raise ValueError naming the prompt id of any prompt the model cannot take."""
        for p in prompts:
            if not p.text.strip():
                raise ValueError(f"prompt {p.prompt_id!r} is empty")


def codebook_by_id(codebook: torch.Tensor, code_ids: torch.Tensor, layout: ImageLayout) -> torch.Tensor:
    """[vocab, D] float: row code_ids[i] holds VQ codebook entry i (the `code_embeddings` table)."""
    codebook = codebook.detach().float()
    table = torch.zeros(layout.vocab_size, codebook.shape[1], device=codebook.device)
    table[code_ids.to(codebook.device)] = codebook
    return table
