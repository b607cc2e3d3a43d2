"""A transformers `DynamicCache` whose batch rows may hold different generated lengths.

Speculative decoders commit a different number of tokens per sample. To keep every sample's
trajectory what it would be alone (and so independent of batch composition, up to float rounding of
batched kernels: docs/design.md §3), each row keeps its own length. The cache tensor stays
rectangular: a forward appends W slots to every row, and slots a row has dropped become holes that
its attention mask hides. Trailing slots that no row uses are cropped for real. With one row, or rows
in step, there are never holes and the forward runs with transformers' own causal mask (the fast path).

Bookkeeping lives on the host: each slot's absolute position per row, -1 for a hole.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache


class RaggedCache:
    def __init__(self, config, prompt_lengths: Sequence[int], uncond_copies: int) -> None:
        """`prompt_lengths` per cache row (cond rows then uncond rows); positions of generated
        token g in row r are prompt_lengths[r] + g. `uncond_copies` is 1 with CFG rows, else 0:
        generated positions of batch row b apply to cache rows b and b + B."""
        self.cache = DynamicCache(config=config)
        self.prompt_len = torch.tensor(list(prompt_lengths), dtype=torch.long)
        self.rows = len(prompt_lengths)
        self.batch = self.rows // (1 + uncond_copies)
        width = int(self.prompt_len.max())
        # Prompts are left-padded to the longest one: pad slots are holes.
        self.slot_pos = torch.arange(width).expand(self.rows, width) - (width - self.prompt_len[:, None])
        self.slot_pos = self.slot_pos.clone()
        self.slot_pos[self.slot_pos < 0] = -1
        self.prompt_width = width
        self.uniform_prompt = bool((self.prompt_len == width).all())
        self.ragged = not self.uniform_prompt  # pad slots are holes
        self._last_window: torch.Tensor | None = None  # the last prepare_at's query positions (keep_slots)

    def prefill_kwargs(self, device: torch.device) -> dict:
        """Positions and mask for a left-padded prompt: each row's real tokens sit at 0..len-1 and attend
        causally to each other only. A pad query attends to itself alone, so no softmax row is empty (no NaN
        reaches the cached keys and values). Nothing where every prompt has the full width."""
        if self.uniform_prompt:
            return {}
        pos = self.slot_pos  # [rows, T], -1 at the left padding
        mask = (pos >= 0)[:, None, :] & (pos[:, None, :] <= pos[:, :, None])
        mask |= torch.eye(pos.shape[1], dtype=torch.bool)
        return {"position_ids": pos.clamp(min=0).to(device), "attention_mask": mask[:, None].to(device)}

    # -- bookkeeping -------------------------------------------------------------------------
    def _expand(self, per_batch_row: Sequence[int]) -> torch.Tensor:
        v = torch.as_tensor(list(per_batch_row), dtype=torch.long)
        return v.repeat(self.rows // self.batch)

    def _in_step(self, lengths: list[int]) -> bool:
        """No holes, one prompt length, every row at the same length: slot index = position."""
        return not self.ragged and self.uniform_prompt and len(set(lengths)) == 1

    def truncate(self, lengths: Sequence[int]) -> None:
        self._last_window = None  # columns move: no window left to adopt slots from
        lengths = list(lengths)
        if self._in_step(lengths):  # cutting a common tail cannot make holes
            drop = self.slot_pos.shape[1] - (self.prompt_width + lengths[0])
        else:
            keep_below = self.prompt_len + self._expand(lengths)
            self.slot_pos[self.slot_pos >= keep_below[:, None]] = -1
            used = (self.slot_pos >= 0).any(0)
            drop = int((~used).flip(0).long().cumprod(0).sum())  # unused columns at the end
        if drop > 0:
            self.cache.crop(-drop)  # crop(-k) drops k slots; crop(0) is not portable
            self.slot_pos = self.slot_pos[:, :-drop]
        if self.ragged or not self._in_step(lengths):
            self.ragged = not bool((self.slot_pos >= 0).all())

    def prepare(self, start: Sequence[int], width: int, device: torch.device) -> dict:
        """Truncate to `start`, register `width` new slots, and return the model kwargs
        (`position_ids`, `attention_mask`) for the window; both None on the fast path."""
        start = list(start)
        self.truncate(start)
        query_pos = self.prompt_len[:, None] + self._expand(start)[:, None] + torch.arange(width)
        fast = self._in_step(start) and self.slot_pos.shape[1] == self.prompt_width + start[0]
        self.slot_pos = torch.cat([self.slot_pos, query_pos], dim=1)
        if fast:
            return {"position_ids": None, "attention_mask": None}
        valid = self.slot_pos >= 0
        mask = valid[:, None, :] & (self.slot_pos[:, None, :] <= query_pos[:, :, None])
        return {
            "position_ids": query_pos.to(device),
            "attention_mask": mask[:, None].to(device),  # [rows, 1, W, slots], True = attend
        }

    def prepare_at(
        self,
        positions: torch.Tensor,
        keep: torch.Tensor,
        window_mask: torch.Tensor,
        device: torch.device,
        transient: torch.Tensor | None = None,
    ) -> dict:
        """General window: `positions` [B, W] generated positions (-1 = padding), `keep` [B, N]
        which cached generated positions stay, `window_mask` [B, W, W] which window slots each
        query sees (True = attend), `transient` [B, W] slots that live for this forward only
        (never seen by a later query). Cached slots at a position being written are replaced.
        Returns the model kwargs; queries see kept cached slots at lower positions."""
        B, W = positions.shape
        self._last_window = None
        rewritten = torch.zeros(keep.shape, dtype=torch.long)
        rewritten.scatter_add_(1, positions.clamp(min=0), (positions >= 0).long())
        keep = keep & (rewritten == 0)  # a position written again replaces its cached slot
        keep_rows = keep.repeat(self.rows // self.batch, 1)
        gen = self.slot_pos - self.prompt_len[:, None]
        is_gen = (gen >= 0) & (self.slot_pos >= 0)
        kept = keep_rows.gather(1, gen.clamp(0, keep.shape[1] - 1))
        self.slot_pos[is_gen & ~kept] = -1
        used = (self.slot_pos >= 0).any(0)
        drop = int((~used).flip(0).long().cumprod(0).sum())
        if drop > 0:
            self.cache.crop(-drop)
            self.slot_pos = self.slot_pos[:, :-drop]
        self.compact()

        pos_rows = positions.repeat(self.rows // self.batch, 1)
        query_pos = torch.where(pos_rows >= 0, self.prompt_len[:, None] + pos_rows, -1)
        old = (self.slot_pos >= 0)[:, None, :] & (self.slot_pos[:, None, :] < query_pos[:, :, None])
        own = window_mask.repeat(self.rows // self.batch, 1, 1) | torch.eye(W, dtype=torch.bool)  # never empty
        mask = torch.cat([old, own], dim=2)
        stored = query_pos
        if transient is not None:  # this forward's mask is built; later ones see holes there
            stored = query_pos.masked_fill(transient.repeat(self.rows // self.batch, 1), -1)
        self.slot_pos = torch.cat([self.slot_pos, stored], dim=1)  # padding slots stay holes (-1)
        self._last_window = query_pos  # keep_slots may still adopt its transient slots
        self.ragged = True
        return {
            "position_ids": query_pos.clamp(min=0).to(device),
            "attention_mask": mask[:, None].to(device),
        }

    def keep_slots(self, keep: torch.Tensor) -> None:
        """Adopt the last `prepare_at` window's slots with `keep` [B, W] (transient ones included) as
        ordinary cached slots at their positions; their keys and values are already in the cache."""
        query_pos = getattr(self, "_last_window", None)
        if query_pos is None or keep.shape != (self.batch, query_pos.shape[1]):
            raise ValueError(
                f"keep_slots: expected [{self.batch}, window] of the last forward_at, got {tuple(keep.shape)}"
            )
        W = query_pos.shape[1]
        window = self.slot_pos[:, -W:]
        chosen = keep.cpu().repeat(self.rows // self.batch, 1) & (query_pos >= 0)
        self.slot_pos[:, -W:] = torch.where(chosen, query_pos, window)

    def compact(self, min_holes: int = 64) -> None:
        """Gather each row's live slots to the front once holes are most of the cache.

        Decoders that drop slots in the middle (PJD rejects drafts of several image rows per
        forward) would otherwise grow the cache by every window they ever wrote."""
        live = self.slot_pos >= 0
        counts = live.sum(1)
        width, new_width = self.slot_pos.shape[1], int(counts.max())
        if width - new_width < max(min_holes, width // 2):
            return
        # Stable order: live slots first (in their old order), then holes.
        order = torch.sort((~live).long(), dim=1, stable=True).indices[:, :new_width]
        for layer in self.cache.layers:
            index = order.to(layer.keys.device)[:, None, :, None]
            layer.keys = layer.keys.gather(2, index.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3]))
            layer.values = layer.values.gather(2, index.expand(-1, layer.values.shape[1], -1, layer.values.shape[3]))
        self.slot_pos = self.slot_pos.gather(1, order)
        self.ragged = True
