"""A preallocated KV cache whose rows hold different generated lengths, with its bookkeeping on the device.

The alternative to `RaggedCache` (sjd/models/cache.py) that a compiled forward needs: every tensor keeps its
shape and address from the prefill on, and nothing is read back to the host. Each cache row (conditional rows,
then unconditional rows) is laid out as

    [prompt: T slots, left-padded][generated: N slots, slot T + g holds generated position g][scratch: S slots]

so a slot never moves and rejected drafts need no holes: a query at position p sees the generated slots below
it that hold a committed or kept token (`live`), and a later window simply overwrites a rejected draft's slot.
Window slots with no position of their own go to the scratch region: transient slots (tree siblings, which
share a position with a chain draft), padding, and the slots a finished row still forwards past the image.
`keep_slots` copies an adopted transient slot down to its position, as EAGLE's tree cache does (a position holds
one slot, so an adopted slot replaces whatever was written at its position; the decoders adopt transient slots
only, as EAGLE does, and there the two caches agree). S is the
widest window this cache takes plus one slot no query reads (where moves that do not happen are written).

Masks, positions and write slots are built from device tensors each forward (the host's start positions reach
the device by a non-blocking copy, sjd.core.staging); the layer writes each row's keys and values at its own slots
(`scatter_`). `tests/models/test_static_cache.py` and the adapter contract hold it to the same logits as
`RaggedCache`.

The keys and values themselves live in a `KVStorage` the adapter keeps: allocated at the first prefill and reused by
every later one (a prompt's cache is a view of its first rows and slots), so their addresses never change within a
run, as a CUDA graph that writes them needs. They are marked static for torch.compile (what transformers' own static
cache does, and why gpt-fast keeps its cache as registered buffers): a graph may write them in place and still be
recorded as a CUDA graph. Stale keys and values from an earlier prompt are never read: every slot a query may see
is written first, and a masked slot weighs exactly 0 in the attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from sjd.core.staging import device_ints

DEFAULT_SCRATCH = 256  # the widest window (forward inputs) a static cache takes unless told otherwise


class KVStorage:
    """Every layer's keys and values, allocated once and reused by every prompt an adapter decodes.

    `views(layer, rows, length, ...)` hands out the first `rows` rows and `length` slots of a layer's tensors,
    allocating (zeros) only where none is big enough yet: at the first prefill, or when a later one needs more rows
    or slots than any before it (`allocations` counts every allocation, so a run that reallocates shows it)."""

    def __init__(self) -> None:
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.allocations = 0

    def views(
        self, layer: int, rows: int, length: int, keys_like: torch.Tensor, values_like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s keys and values [rows, heads, length, head_dim], in the dtype and device of the `*_like`
        states, as views of its storage (allocated or grown here when it does not fit)."""
        while len(self.layers) <= layer:
            self.layers.append((keys_like.new_zeros(0), values_like.new_zeros(0)))
        keys, values = self.layers[layer]
        if not (self._fits(keys, rows, length, keys_like) and self._fits(values, rows, length, values_like)):
            had_rows, had_slots = (keys.shape[0], keys.shape[2]) if keys.dim() == 4 else (0, 0)
            rows_, slots = max(rows, had_rows), max(length, had_slots)  # grown, never shrunk
            keys = keys_like.new_zeros(rows_, keys_like.shape[1], slots, keys_like.shape[-1])
            values = values_like.new_zeros(rows_, values_like.shape[1], slots, values_like.shape[-1])
            self.layers[layer] = (keys, values)
            self.allocations += 1
        return self.static(keys[:rows, :, :length]), self.static(values[:rows, :, :length])

    @staticmethod
    def _fits(have: torch.Tensor, rows: int, length: int, like: torch.Tensor) -> bool:
        return (
            have.dim() == 4
            and have.shape[0] >= rows
            and have.shape[2] >= length
            and (have.shape[1], have.shape[3]) == (like.shape[1], like.shape[-1])
            and have.dtype == like.dtype
            and have.device == like.device
        )

    @staticmethod
    def static(t: torch.Tensor) -> torch.Tensor:
        """`t` marked as a static address for torch.compile: written in place by a graph that CUDA graphs record."""
        torch._dynamo.mark_static_address(t)
        return t

    def addresses(self) -> list[int]:
        """Every storage tensor's address: the same from prompt to prompt unless something was reallocated."""
        return [t.data_ptr() for pair in self.layers for t in pair]


class RowSlotLayer(CacheLayerMixin):
    """One layer's keys and values [rows, heads, T + N + S, head_dim], written at the owner's `write_slots`: views
    of the owner's storage."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: StaticRowCache) -> None:
        super().__init__()
        self.owner = owner
        self.index = len(owner.cache.layers)  # transformers' Cache appends a layer as each is first updated

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        owner = self.owner
        self.keys, self.values = owner.storage.views(self.index, owner.rows, owner.length, key_states, value_states)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.owner.write_slots[:, None, :, None]
        self.keys.scatter_(2, slots.expand_as(key_states), key_states.to(self.keys.dtype))
        self.values.scatter_(2, slots.expand_as(value_states), value_states.to(self.values.dtype))
        return self.keys, self.values

    def move(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Copy slot source[r, j] to slot target[r, j] ([rows, W]) in keys and values."""
        for t in (self.keys, self.values):
            moved = t.gather(2, source[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3]))
            t.scatter_(2, target[:, None, :, None].expand_as(moved), moved)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.length, 0

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.owner.length


class StaticRowCache:
    """`RaggedCache`'s interface (prefill_kwargs, prepare, prepare_at, keep_slots, truncate, `.cache` for the
    model) over one preallocated tensor per layer. `n_tokens` is the image's generated positions; `scratch` the
    widest window it takes."""

    def __init__(
        self,
        prompt_lengths: Sequence[int],
        uncond_copies: int,
        n_tokens: int,
        device: torch.device,
        scratch: int = DEFAULT_SCRATCH,
        prompt_slots: int | None = None,
        storage: KVStorage | None = None,
    ) -> None:
        """`prompt_slots`: the prompt region's width, at least the longest prompt (default: exactly that). A
        compiled forward rounds it up, so that prompts of other lengths keep the cache's shape. `storage`: the
        adapter's keys and values, reused from prompt to prompt (default: a storage of this cache's own)."""
        self.device = torch.device(device)
        self.storage = storage if storage is not None else KVStorage()
        self.prompt_len = device_ints(prompt_lengths, self.device)
        self.rows = len(prompt_lengths)
        self.copies = 1 + uncond_copies
        self.batch = self.rows // self.copies
        self.input_width = int(max(prompt_lengths))  # the prefill's width: its ids are left-padded to it
        self.prompt_width = T = max(self.input_width, prompt_slots or 0)
        self.n_tokens, self.scratch = n_tokens, scratch
        self.length = T + n_tokens + scratch + 1  # + the slot no query reads
        self.sink = self.length - 1
        pad = T - self.prompt_len
        self.prompt_pos = torch.arange(T, device=self.device)[None, :] - pad[:, None]  # [rows, T], < 0 at padding
        self.live = torch.zeros(self.rows, n_tokens, dtype=torch.bool, device=self.device)
        self.write_slots = torch.arange(T, device=self.device).expand(self.rows, T)
        self.cache = Cache(layer_class_to_replicate=lambda: RowSlotLayer(self))
        self.cache.row_cache = self  # for a network of our own that reads where each query is written (LlamaGen)
        self._last_window: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    # -- helpers ---------------------------------------------------------------------------------------
    def _rows(self, per_batch_row: torch.Tensor) -> torch.Tensor:
        """A per-batch-row tensor repeated for the unconditional rows."""
        return per_batch_row.to(self.device).repeat(self.copies, *[1] * (per_batch_row.dim() - 1))

    def _check_width(self, width: int) -> None:
        if width > self.scratch:
            raise ValueError(
                f"a window of {width} forward inputs is wider than the static cache's scratch of {self.scratch} slots; "
                "raise its `scratch` or use cache=dynamic"
            )

    def _mask(self, query_pos: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """[rows, 1, W, length]: the prompt's real slots for every query at a position >= 0, and `old` [rows, W, N]
        over the generated slots; the scratch columns are left to the caller."""
        rows, W = query_pos.shape
        prompt = (self.prompt_pos >= 0)[:, None, :] & (query_pos >= 0)[:, :, None]
        rest = torch.zeros(rows, W, self.scratch + 1, dtype=torch.bool, device=self.device)
        return torch.cat([prompt, old, rest], dim=2)

    # -- RaggedCache's interface ------------------------------------------------------------------------
    def prefill_kwargs(self, device: torch.device) -> dict:
        """The prompt's positions and mask: real tokens at 0..len-1, causal among themselves; a pad query sees
        itself alone (finite, never read)."""
        T, width = self.prompt_width, self.input_width
        offset = T - width  # the prompt region's slots left of the prefill's ids hold nothing
        query = self.prompt_pos[:, offset:]  # [rows, width] the prefill's positions, < 0 at padding
        slots = offset + torch.arange(width, device=self.device)
        self.write_slots = slots.expand(self.rows, width)
        prompt = (self.prompt_pos >= 0)[:, None, :] & (self.prompt_pos[:, None, :] <= query[:, :, None])
        prompt[:, torch.arange(width, device=self.device), slots] = True  # a pad query sees itself: finite, unread
        rest = torch.zeros(self.rows, width, self.length - T, dtype=torch.bool, device=self.device)
        mask = torch.cat([prompt, rest], dim=2)
        return {"position_ids": query.clamp(min=0).to(device), "attention_mask": mask[:, None].to(device)}

    def truncate(self, lengths: Sequence[int]) -> None:
        keep_below = self._rows(device_ints(lengths, self.device))
        self.live &= torch.arange(self.n_tokens, device=self.device)[None, :] < keep_below[:, None]
        self._last_window = None

    def prepare(self, start: Sequence[int], width: int, device: torch.device) -> dict:
        """Row b writes generated positions start[b] .. start[b] + width - 1 after dropping those >= start[b]."""
        self._check_width(width)
        T, N = self.prompt_width, self.n_tokens
        first = self._rows(device_ints(start, self.device))
        gen = first[:, None] + torch.arange(width, device=self.device)  # [rows, W] the queries' positions
        slots = torch.arange(N, device=self.device)[None, :]
        self.live &= slots < first[:, None]
        self.live |= (slots >= first[:, None]) & (slots < first[:, None] + width)
        old = self.live[:, None, :] & (slots[:, None, :] <= gen[:, :, None])
        mask = self._mask(gen, old)
        beyond = T + N + (gen - N).clamp(0, self.scratch - 1)  # a finished row's slots past the image
        self.write_slots = torch.where(gen < N, T + gen, beyond)
        mask.scatter_(2, torch.where(gen < N, self.sink, self.write_slots)[:, :, None], gen[:, :, None] >= N)
        self._last_window = None
        return {"position_ids": (self.prompt_len[:, None] + gen).to(device), "attention_mask": mask[:, None].to(device)}

    def prepare_at(
        self,
        positions: torch.Tensor,
        keep: torch.Tensor,
        window_mask: torch.Tensor,
        device: torch.device,
        transient: torch.Tensor | None = None,
    ) -> dict:
        """As RaggedCache.prepare_at: `positions` [B, W] (-1 = padding), `keep` [B, N], `window_mask` [B, W, W],
        `transient` [B, W]."""
        B, W = positions.shape
        self._check_width(W)
        T, N = self.prompt_width, self.n_tokens
        pos = self._rows(positions.long())
        keep_rows = self._rows(keep.bool())
        trans = self._rows(transient.bool()) if transient is not None else torch.zeros_like(pos, dtype=torch.bool)
        in_place = (pos >= 0) & ~trans
        column = torch.arange(W, device=self.device).expand_as(pos)
        slot_of = torch.where(in_place, T + pos.clamp(min=0), T + N + column)
        written = torch.zeros(self.rows, N, dtype=torch.long, device=self.device)
        written.scatter_add_(1, pos.clamp(min=0), in_place.long())
        self.live &= keep_rows & (written == 0)  # a position written again replaces its cached slot
        slots = torch.arange(N, device=self.device)
        old = self.live[:, None, :] & (slots[None, None, :] < pos[:, :, None])
        mask = self._mask(pos, old)
        own = self._rows(window_mask.bool()) | torch.eye(W, dtype=torch.bool, device=self.device)  # never empty
        mask.scatter_(2, slot_of[:, None, :].expand(-1, W, -1), own)
        self.live |= written > 0
        self.write_slots = slot_of
        self._last_window = (pos, slot_of, trans)
        position_ids = torch.where(pos >= 0, self.prompt_len[:, None] + pos, 0)
        return {"position_ids": position_ids.to(device), "attention_mask": mask[:, None].to(device)}

    def keep_slots(self, keep: torch.Tensor) -> None:
        """Adopt the last `prepare_at` window's slots with `keep` [B, W] as cached slots at their positions: a
        transient one is copied down to its position's slot."""
        if self._last_window is None or keep.shape != (self.batch, self._last_window[0].shape[1]):
            width = "window" if self._last_window is None else self._last_window[0].shape[1]
            raise ValueError(
                f"keep_slots: expected [{self.batch}, {width}] of the last forward_at, got {tuple(keep.shape)}"
            )
        pos, slot_of, trans = self._last_window
        chosen = self._rows(keep.bool()) & (pos >= 0)
        moving = chosen & trans
        target = torch.where(moving, self.prompt_width + pos.clamp(min=0), self.sink)
        for layer in self.cache.layers:
            layer.move(slot_of, target)
        adopted = torch.zeros_like(self.live, dtype=torch.long).scatter_add_(1, pos.clamp(min=0), chosen.long())
        self.live |= adopted > 0
