"""Siblings drafted by heads in the coupled chain: `csjd_pac`'s chain, with SJD-PAC's sibling slots filled by
independent head draws (docs/algorithms.md §12.8, "Head siblings").

`csjd_pac_heads` writes the heads' drafts over the coupled chain's at the heads' offsets, so it loses the long runs
the maximal coupling keeps accepted. Here the heads never touch the chain: it is drawn exactly as `csjd_pac` draws it
(maximal coupling, drafts from the row above, forced drafts). What changes is where the siblings at its first
`branch_depth` positions come from:

- After every commit, one heads call on the feature that predicted the last committed token (as
  sjd.decoders.headed does) draws a draft at each of the heads' offsets, each from its own head's q. The right
  heads' drafts land on the positions right after the commit, where the carried chain drafts are stale: they were
  drawn given a token the commit rejected (or are fresh drafts from the row above where the whole chain passed).
- Every head draft waits in a per-row cache with its q until the chain reaches its position, as Hawk's below-head
  speculations do (sjd.decoders.hawk, `SpeculationPool`): with heads that draft a row or more ahead (spatial heads,
  `decoder.heads.weights=${model.spatial_heads}`), those join the pool a row later; drafts an earlier call made at
  offsets the commits have not yet passed stay in it beside the latest call's.
- At each of the chain's first `branch_depth` positions, up to `branches - 1` of them (the latest call's first)
  are siblings: leaf slots that see the chain before them, verified by recursive rejection at the chain's first
  rejection, each with its own q (`tree_tests` with `sibling_q`). `window` counts every forward input.

Lossless by construction:
1. Each sibling's q depends only on committed tokens. A heads call reads the target's feature at the slot holding
   the input before the last committed token: that slot sees committed tokens only (the chain before the first
   rejection, or the accepted sibling whose output gave the bonus), and the heads and the shared pipeline turn it
   into q deterministically. The draft is one uniform from the row's generator, used for nothing else.
2. A sibling is independent of everything verification has looked at before it is tested. Its slot is transient
   and no other slot sees it, and its own output is read only if it is accepted; the chain's drafts, their coupling
   and every coin are drawn apart from it. Whether it is in the pool depends on its position, the commit history
   and how many wait there, never on its value (forced positions are skipped: a rule on positions). It is tested
   at most once: when tested, its position is committed (by it or the residual) and the cache drops it.
3. So at the chain's first rejection at position m, the chain draft is a sample of its recorded q (csjd's coupling
   argument, unchanged), and then each sibling is a fresh, independent sample of its own q_i. Recursive rejection
   (u * q_i(s) < target(s), else target <- norm(max(0, target - q_i))) is a chain of speculative-sampling steps,
   each falling back on the next; a sample of the target left after the last is distributed as the target before
   the first, i.e. as p at m given the committed prefix, whatever the q_i. An accepted sibling's bonus is SJD-PAC's
   (the carried draft tested against the sibling's own p). Verifying a sibling as if drawn without replacement from
   the chain draft's q, as SJD-PAC's own siblings are, would bias the result; the micro-model audit catches that
   slip (tests/decoders/test_head_siblings.py).

Samples record `head_forwards`, `heads` (one call, every head) and `branch_commits` (forwards whose committed token
was a sibling).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sjd.decoders.hawk import HawkState, SpeculationPool
from sjd.decoders.headed import HeadsContinuation
from sjd.decoders.sjd_pac import SJDPACDecoder
from sjd.decoders.window import WindowCall
from sjd.decoders.window_state import Redraft
from sjd.types import FEATURES, ImageLayout


@dataclass(eq=False, kw_only=True)
class CoupledHeadSiblingsDecoder(SpeculationPool, HeadsContinuation, SJDPACDecoder):
    requires = SJDPACDecoder.requires | {FEATURES}

    name: str = "csjd_head_siblings"
    replace: str = field(default="none", init=False)  # the heads never replace a chain draft

    def speculates_at(self, layout: ImageLayout, position: int) -> bool:
        """Not at grammar-forced positions: the chain's forced draft is always accepted there, so a sibling there
        would only take a slot."""
        return bool(layout.forced[position] < 0)

    def adopt(self, state: HawkState, call: WindowCall, redraft: Redraft) -> None:
        """Counts the heads call (HeadsContinuation.adopt, which replaces nothing here) and caches every head's
        draft as a speculation at its position."""
        super().adopt(state, call, redraft)
        self.cache_speculations(state, call, redraft, self.load(call.adapter).offsets)

    def chain_plan(
        self, state: HawkState, b: int, lead: int, width: int, layout: ImageLayout, room: list[tuple[bool, int]]
    ) -> tuple[int, list[int]]:
        """The coupled chain's length (carried drafts, topped up as csjd_pac does), and at its first positions as
        many siblings as speculations wait there (`room`), up to `branches - 1`; the chain takes the rest of the
        window."""
        n, N = state.committed[b], layout.n_tokens
        budget = max(width - lead, 0) if width else 0
        counts: list[int] = []
        for k in range(min(len(room), N - n)):
            count = min(self.branches - 1, room[k][1])
            if k + 1 + sum(counts) + count > budget:  # the chain up to k and every sibling so far must fit
                break
            counts.append(count)
        while counts and counts[-1] == 0:
            counts.pop()
        return min(budget - sum(counts), N - n), counts
