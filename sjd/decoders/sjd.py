"""Speculative Jacobi Decoding (Teng et al., ICLR 2025; docs/algorithms.md §4).

To read the algorithm, read sjd/decoders/reference.py: the same SJD for one image in one function, which
tests/decoders/test_reference_sjd.py holds this decoder to, token for token. This file is that algorithm batched
over ragged rows, as the phases (draft, forward, verify, commit) of the window family's one loop
(sjd.decoders.window), which the other window decoders change.

Each iteration forwards a window [last committed token, d_1 .. d_{L-1}] against the cache,
verifies the drafts left to right with the speculative rule (sjd.core.verify), commits the accepted
prefix plus one residual (or bonus) token, and keeps the model's own samples at the positions
after the commit as the next drafts, with the distribution they were drawn from as their q
(the Jacobi update). Fresh slots at the end of the window get drafts from sjd.core.drafts.

Choices where the paper leaves room (all config, see conf/decoder/sjd.yaml):
- `window` counts forward inputs, so at most `window` tokens are committed per forward;
  near the end of the image it shrinks to the tokens left.
- `schedule` (sjd.core.schedule): `harness` windows are `window` wide, one token per forward at
  generated positions below `ar_prefix` or in the last `ar_suffix`; `official` is the official
  sampler's loop (Jacobi only inside the model family's [l, r), a window capped at r, sized from
  the row's length one iteration back), for reproducing the papers' tables; `official_l` is its l
  (1, the official evaluation loaders'; the SJD repository's Lumina-mGPT demo script uses 3).
- Drafts at grammar-forced positions are the forced token (one-hot q): lossless, and it avoids
  the certain rejection a random draft meets there. This is the harness's improvement: the official
  sampler drafts those slots like any other, so rows reproducing a paper set `forced_drafts=false`.
- `verification: block` decides the accepted length for the window jointly (sjd.core.verify.block_verify,
  Sun et al. 2025): exact, and never fewer accepted drafts in expectation than `token`, the paper's
  left-to-right rule. It needs fresh next drafts, which SJD's Jacobi update draws; coupled decoders
  keep `token` (sjd.decoders.coupled says why).
- Batch > 1: every row commits its own accepted count and keeps its own cache length (the
  adapter's ragged cache), so each sample follows exactly the trajectory it would follow
  alone. There is no `min over the batch` commit, hence no bias (docs/algorithms.md §4.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sjd.core.drafts import DISTRIBUTION_SCHEMES, SCHEMES
from sjd.core.staging import device_ints
from sjd.core.verify import VerifyResult
from sjd.decoders.base import WINDOW_CAPABILITY
from sjd.decoders.top_up import top_up_rows
from sjd.decoders.window import WindowDecoder, WindowStep
from sjd.decoders.window_state import WindowState, draw_uniforms
from sjd.types import ImageLayout


@dataclass(eq=False, kw_only=True)
class SJDDecoder(WindowDecoder):
    requires = WINDOW_CAPABILITY
    verifications = ("token", "block")  # the rules `verification` may name

    name: str = "sjd"
    init: str = "random"
    verification: str = "token"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.init not in SCHEMES + DISTRIBUTION_SCHEMES:
            raise ValueError(f"decoder.init must be one of {SCHEMES + DISTRIBUTION_SCHEMES}, got {self.init!r}")
        if self.verification not in self.verifications:
            raise ValueError(f"decoder.verification must be one of {self.verifications}, got {self.verification!r}")

    def new_state(self, B: int, layout: ImageLayout, device: torch.device) -> WindowState:
        """Empty per-row state; vertical_dist drafts also need the last row_stride committed p."""
        keep_p = layout.row_stride if self.init in DISTRIBUTION_SCHEMES else 0
        return WindowState.empty(B, layout.n_tokens, layout.vocab_size, device, keep_p)

    # -- phases --------------------------------------------------------------------------------------
    def draft(self, step: WindowStep) -> None:
        """Window inputs [B, W] = [last committed, drafts...], drafts [B, W-1] and their q: every row's carried
        drafts topped up (each row's fresh ones from its own generator), laid out for the batch at once."""
        state, widths, layout, generators = step.state, step.widths, step.call.layout, step.call.generators
        device = state.tokens.device
        needs = [max(w - 1, 0) for w in widths]
        planned = self.top_up(state, needs, layout, generators)
        drafts = torch.nn.utils.rnn.pad_sequence([d for d, _ in planned], batch_first=True)
        last = device_ints([min(n, layout.n_tokens) - 1 for n in state.committed], device)[:, None]
        step.inputs = torch.cat([state.tokens.gather(1, last), drafts], 1)
        step.drafts, step.q = drafts, torch.nn.utils.rnn.pad_sequence([dq for _, dq in planned], batch_first=True)
        step.n_drafts = device_ints(needs, device)

    def top_up(
        self, state: WindowState, needs: list[int], layout: ImageLayout, generators: list[torch.Generator]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per row b, its carried drafts for its next `needs[b]` positions, topped up with fresh ones of `init`,
        and their q: the batch at once (sjd.decoders.top_up), each row drawing what it would draw alone."""
        return top_up_rows(self.init, self.forced_drafts, state, needs, layout, generators)

    def forward(self, step: WindowStep) -> None:
        """The window against the cache; output i of row b predicts position committed[b] + i."""
        call, committed = step.call, step.state.committed
        step.logits = call.clock.forward(step.inputs, [n - 1 for n in committed])
        offsets = torch.arange(step.inputs.shape[1], device=call.device)
        step.positions = device_ints(committed, call.device)[:, None] + offsets
        step.p = self.kernels.pipeline(step.logits, step.positions, call.layout, call.sampling)

    def verify(self, step: WindowStep) -> None:
        """Speculative rule (sjd.core.verify), plus one new draft per slot and its q (`next_drafts`)."""
        u_accept, u_jacobi = draw_uniforms(step.call.generators, step.widths, step.p.shape[1], step.p.device)
        u_final = u_accept.gather(1, step.n_drafts[:, None]).squeeze(1)  # each row's own last uniform
        step.result = self.accept(step, u_accept[:, :-1], u_final)
        step.samples, step.samples_q = self.next_drafts(step, u_jacobi)

    def accept(self, step: WindowStep, accept_uniforms: torch.Tensor, sample_uniforms: torch.Tensor) -> VerifyResult:
        """The acceptance rule: exact speculative sampling, token by token or for the block as a
        whole (relaxed decoders replace it)."""
        rule = self.kernels.block_verify if self.verification == "block" else self.kernels.verify
        return rule(step.p, step.drafts, step.q, step.n_drafts, accept_uniforms, sample_uniforms)

    def next_drafts(self, step: WindowStep, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, C+1] the drafts the chain slots carry into the next iteration and [B, C+1, V] the
        distributions they are drawn from given everything verification has seen (their q).
        SJD draws them from p independently of the old drafts (the Jacobi update); coupled
        decoders (sjd.decoders.coupled) correlate them with the old ones."""
        return self.kernels.sample_from(step.p, uniforms), step.p

    def commit(self, step: WindowStep) -> None:
        """The accepted drafts and the token after them, the carried drafts; in an SJD window, slot a holds the
        input at position committed - 1 + a."""
        step.state.commit(step.result, step.drafts, step.samples, step.p, step.widths, step.samples_q)
        B, W = step.inputs.shape
        step.slots = torch.arange(W, device=step.inputs.device).expand(B, W)
        self.after_commit(step)
