"""Types every layer shares: prompts, the image layout, raw logits, and capability names.

They sit at the bottom of the package so that the pure core (sampling, drafts, verification) and
the harness depend on them without depending on the model layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Capabilities a decoder can require of a model (see Decoder.requires).
WINDOW = "window"  # forward of several tokens against the cache, ragged rows
CUSTOM_MASK = "custom_mask"  # an extra [B, W, W] attention mask inside the window (PJD)
EMBEDS = "embeds"  # forward from input embeddings instead of ids (SJD2)
CODE_EMBEDDINGS = "code_embeddings"  # a latent vector per image code (relaxed acceptance: GSD, LANTERN)
FEATURES = "features"  # the last hidden state of every forward, the LM head and the token embeddings (drafters)


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    text: str


@dataclass(frozen=True)
class ImageLayout:
    """Where every generated token goes, and which tokens the grammar allows there.

    `forced[pos]` is the token id the grammar forces at generated position `pos` (begin- and
    end-of-image, size tokens, end-of-line), or -1 where an image code is free to choose.
    `free_tokens` is the vocabulary mask of the ids allowed at free positions.
    """

    n_tokens: int
    height: int  # rows of image codes
    width: int  # codes per row
    row_stride: int  # tokens per row in the stream: width, plus 1 with an end-of-line token
    first_code: int  # generated position of the first image code
    forced: torch.Tensor  # [n_tokens] long
    free_tokens: torch.Tensor  # [vocab] bool
    vocab_size: int

    @property
    def free_token_ids(self) -> torch.Tensor:
        return self.free_tokens.nonzero().flatten()

    def free_columns(self, device: torch.device) -> slice | torch.Tensor:
        """The free ids as a column index: a slice when they are one contiguous range (every
        real model's image codes are), which reads logits without a copy; else the id tensor."""
        return self._cached(
            "free_columns", device, lambda: _contiguous_span(self.free_token_ids) or self.free_token_ids.to(device)
        )

    def free_ids(self, device: torch.device) -> torch.Tensor:
        """`free_token_ids` on `device`, copied there once per device (not once per call)."""
        return self._cached("free_ids", device, lambda: self.free_token_ids.to(device))

    def forced_on(self, device: torch.device) -> torch.Tensor:
        """`forced` [n_tokens] on `device`, copied there once per device."""
        return self._cached("forced_on", device, lambda: self.forced.to(device))

    def forced_table(self, device: torch.device) -> torch.Tensor:
        """[n_tokens + 1] long: the forced id at each position, -1 where free and for the padding row."""

        def padded() -> torch.Tensor:
            return torch.cat([self.forced, self.forced.new_full((1,), -1)]).to(device)

        return self._cached("forced_table", device, padded)

    def _cached(self, name: str, device: torch.device, build):
        cache = self.__dict__.setdefault(f"_{name}", {})  # frozen dataclass: the cache bypasses __setattr__
        key = str(device)
        if key not in cache:
            cache[key] = build()
        return cache[key]

    def allowed_table(self, device: torch.device) -> torch.Tensor:
        """[n_tokens + 1, V] bool: the allowed ids at each position (forced ones one-hot); the
        last row, for positions past the image (window padding), allows the free ids."""
        key = str(device)
        cache = self.__dict__.setdefault("_allowed_tables", {})
        if key not in cache:
            one_hot = torch.nn.functional.one_hot(self.forced.clamp(min=0), self.vocab_size).bool()
            rows = torch.where((self.forced >= 0)[:, None], one_hot, self.free_tokens[None])
            cache[key] = torch.cat([rows, self.free_tokens[None]]).to(device)
        return cache[key]


def _contiguous_span(ids: torch.Tensor) -> slice | None:
    if len(ids) and int(ids[-1] - ids[0]) + 1 == len(ids):
        return slice(int(ids[0]), int(ids[-1]) + 1)
    return None


@dataclass
class Features:
    """What a trained drafter reads from the target (the `features` capability): the target's last hidden
    state after its final norm, for every slot of the forward, rows as the model runs them (the conditional
    rows, then with CFG the unconditional rows, in the same order).

    After a prefill the slots are the prompt's, left-padded to the longest row as the model ran them:
    `ids` [R, T] are the input ids there (0 where a prompt slot is not a token, as LlamaGen's caption
    slots) and `lengths` each row's prompt length; a window forward leaves both None."""

    hidden: torch.Tensor  # [R, W, H]
    ids: torch.Tensor | None = None
    lengths: list[int] | None = None


@dataclass
class Logits:
    """Raw logits for a window: conditional rows and, with CFG, the unconditional rows; with the
    `features` capability, the hidden states they were computed from."""

    cond: torch.Tensor  # [B, W, V]
    uncond: torch.Tensor | None  # [B, W, V] or None when CFG is off
    features: Features | None = None
