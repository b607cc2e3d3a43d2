"""One generate() call's drafter: the network, its static per-row cache, and the q it drafts from.

The drafter runs the rows the target runs (conditional rows, then with CFG the unconditional rows), each
with that row's own target features and the same drafted tokens, and its predicted features go through
the target's LM head and the shared logits pipeline: CFG mix, grammar, temperature, top-k / top-p
(sjd.core.sampling), exactly as p is made. So q differs from p only by what the drafter got wrong.

Cache. A preallocated [rows, kv_heads, S, head_dim] per layer, with slot = the row position of the
feature a pair holds (the prompt's slots from 0, then generated position g's token at slot P_r + g - 1
for a row whose prompt has P_r slots): a pair is always written where its position says, a query at
position p sees the slots at or below p, and whatever a rejected draft left above that is overwritten
before anyone can see it, so the cache needs no holes and rows of different lengths need no padding.
Draft trees write to a scratch region after the row positions, which the next tree overwrites; padding
writes go to one last slot that no query sees. Masks are built on the device from positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sjd.core.sampling import SamplingConfig, logits_to_probs
from sjd.core.staging import device_ints
from sjd.drafters.net import DrafterNet
from sjd.models.base import ModelAdapter
from sjd.types import Features


@dataclass
class TreeRoot:
    """Where one draft tree hangs in the drafter's cache (DrafterRun.tree_root)."""

    last: torch.Tensor  # [R, 1] the row position of each row's root pair; a node at depth d sits at last + d
    committed: torch.Tensor  # [R, 1, length] the committed slots every node of the tree sees: 0 .. last


class DrafterRun:
    """The drafter of one call. `lap(stage)` is the call's stage clock: the drafter's own forwards (network
    and LM head) are lapped as "drafter", so drafter time is a stage of its own."""

    def __init__(
        self,
        net: DrafterNet,
        adapter: ModelAdapter,
        sampling: SamplingConfig,
        batch: int,
        scratch: int,
        lap: Callable[[str], None] = lambda stage: None,
        code_head: bool = False,
    ) -> None:
        self.net, self.adapter, self.sampling = net, adapter, sampling
        self.head = adapter.code_head if code_head else adapter.head  # the same q either way (code_head)
        self.layout = adapter.layout
        self.batch = batch
        self.copies = 2 if sampling.uses_uncond else 1
        self.rows = batch * self.copies
        self.scratch = scratch
        self.lap = lap
        self.forwards = 0  # drafter forwards (each one call of the network over every row)
        self.row_forwards: torch.Tensor | None = None  # [B] the forwards in which each row had a real pair
        self.prompt_len: torch.Tensor | None = None  # [R] prompt slots of each row
        self.h_last: torch.Tensor | None = None  # [R, H] the output after the last committed pair

    # -- rows ---------------------------------------------------------------------------------------
    def to_rows(self, x: torch.Tensor) -> torch.Tensor:
        """A per-batch-row tensor [B, ...] repeated for every CFG copy: [R, ...]."""
        return x.repeat(self.copies, *([1] * (x.dim() - 1)))

    def slot_of(self, gen_pos: torch.Tensor) -> torch.Tensor:
        """[R, W] the cache slot (= row position of the feature) of the pair whose token sits at generated
        position `gen_pos` [B, W]."""
        return self.prompt_len[:, None] + self.to_rows(gen_pos) - 1

    # -- the call -----------------------------------------------------------------------------------
    def start(self, features: Features, first: torch.Tensor) -> None:
        """Allocate the cache and run the prompt's pairs: (f_i, id_{i+1}) over the prompt slots and
        (f_last, `first` [B]) at its end, the token the prefill sampled."""
        hidden, ids, lengths = features.hidden, features.ids, features.lengths
        if ids is None or lengths is None:
            raise ValueError(
                f"model {self.adapter.name!r}: a prefill must give its prompt ids and lengths to a drafter"
            )
        R, T, _ = hidden.shape
        device = hidden.device
        self.prompt_len = device_ints(lengths, device)
        self.length = T + self.layout.n_tokens  # row positions a row can reach
        S = self.length + self.scratch + 1
        cfg = self.net.config
        dtype = self.net.fc.weight.dtype
        shape = (R, cfg.num_key_value_heads, S, cfg.head_dim)
        self.kv = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))]
        self.dump = S - 1
        tokens = torch.cat([ids[:, 1:], self.to_rows(first.to(device))[:, None]], dim=1)
        positions = torch.arange(T, device=device)[None, :] - (T - self.prompt_len[:, None])
        out = self.run(tokens, hidden, positions, positions, self.committed_mask(positions))
        self.h_last = out[:, -1]

    def catch_up(self, hidden: torch.Tensor, tokens: torch.Tensor, gen_pos: torch.Tensor, count: torch.Tensor) -> None:
        """The pairs a verification committed: target features `hidden` [R, A, H] of the root and the
        accepted nodes, each with the token after it, `tokens` [B, A] at generated positions `gen_pos`
        [B, A]; `count` [B] of them are real in each row (at least 1 where the row goes on, 0 for a row that
        is complete). `h_last` becomes the output of each row's last real pair."""
        A = tokens.shape[1]
        real = torch.arange(A, device=tokens.device)[None, :] < count[:, None]
        positions = torch.where(self.to_rows(real), self.slot_of(gen_pos), -1)
        out = self.run(self.to_rows(tokens), hidden, positions, positions, self.committed_mask(positions))
        last = self.to_rows((count - 1).clamp(min=0))
        rows = torch.arange(self.rows, device=tokens.device)
        self.h_last = torch.where(self.to_rows(count > 0)[:, None], out[rows, last], self.h_last)

    def tree_root(self, root_pos: torch.Tensor) -> TreeRoot:
        """Where the nodes of a tree (or chain) under each row's root, the token at generated position `root_pos`
        [B], sit in the cache and which committed slots they see: made once per tree, since every node of it
        sees the same committed slots and only its depth moves its position."""
        last = self.slot_of(root_pos[:, None])  # [R, 1]
        keys = torch.arange(self.length, device=root_pos.device)
        return TreeRoot(last, keys[None, None, :] <= last[:, :, None])

    def expand(
        self,
        root: TreeRoot,
        parent_hidden: torch.Tensor,
        tokens: torch.Tensor,
        depth: int,
        alive: torch.Tensor,
        scratch_slot: torch.Tensor,
        sees_scratch: torch.Tensor,
    ) -> torch.Tensor:
        """Tree nodes at one `depth` below the root: pairs (the parent's predicted features `parent_hidden`
        [R, F, H], the node's token `tokens` [B, F]), written to scratch slots `scratch_slot` [F] (0 .. scratch -
        1), each seeing the committed slots of its row up to the root's pair and the scratch slots `sees_scratch`
        [R or 1, F, scratch] (its ancestors and itself). A node that is not `alive` [B, F] is padding: it writes
        the dump slot and also sees it, as every padding pair does. Returns the nodes' predicted features
        [R, F, H]."""
        alive = self.to_rows(alive)
        positions = torch.where(alive, root.last + depth, -1)
        F = tokens.shape[1]
        mask = torch.cat(
            [root.committed.expand(-1, F, -1), sees_scratch.expand(self.rows, -1, -1), (~alive)[..., None]], dim=2
        )
        return self.run(self.to_rows(tokens), parent_hidden, positions, self.length + scratch_slot, mask)

    def q(self, hidden: torch.Tensor, gen_pos: torch.Tensor) -> torch.Tensor:
        """[B, K, V] the draft distribution at generated positions `gen_pos` [B, K] from predicted
        features `hidden` [R, K, H]: the target's head, then the shared logits pipeline."""
        probs = logits_to_probs(self.head(hidden), gen_pos, self.layout, self.sampling)
        self.lap("drafter")
        return probs

    # -- plumbing -----------------------------------------------------------------------------------
    def committed_mask(self, positions: torch.Tensor) -> torch.Tensor:
        """[R, W, S]: a committed pair at row position p sees slots 0 .. p; padding (-1) sees the dump slot."""
        S = self.length + self.scratch + 1
        keys = torch.arange(S, device=positions.device)
        mask = (keys[None, None, :] <= positions[..., None]) & (keys < self.length)[None, None, :]
        return mask | (positions < 0)[..., None] & self.dump_only(S, positions.device)

    def dump_only(self, S: int, device: torch.device) -> torch.Tensor:
        only = torch.zeros(S, dtype=torch.bool, device=device)
        only[self.dump] = True
        return only

    def run(
        self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask
    ) -> torch.Tensor:
        """One drafter forward over every row; padding (position -1) writes the dump slot."""
        self.lap("draft")
        slots = torch.where(positions >= 0, slots, self.dump)
        with torch.no_grad():
            out = self.net(tokens.clamp(min=0), features, positions.clamp(min=0), self.kv, slots, mask)
        self.forwards += 1
        # the CFG copies of a row hold the same pairs, so the first copy says which rows had a real one (no host sync)
        real = (positions[: self.batch] >= 0).any(1)
        self.row_forwards = real.long() if self.row_forwards is None else self.row_forwards + real
        self.lap("drafter")
        return out
