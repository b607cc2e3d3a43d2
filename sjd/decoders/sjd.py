"""Speculative Jacobi Decoding (Teng et al., ICLR 2025; docs/algorithms.md §4).

To read the algorithm, read sjd/decoders/reference.py: the same SJD for one image in one function, which
tests/decoders/test_reference_sjd.py holds this decoder to, token for token. This file is that loop batched over ragged
rows, split into the phases (draft, verify, commit, ...) the other window decoders change.

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from sjd.core.drafts import DISTRIBUTION_SCHEMES, SCHEMES, distribution_drafts, fresh_drafts, one_hot
from sjd.core.sampling import SamplingConfig, logits_to_probs, sample_from
from sjd.core.schedule import OFFICIAL_L, WindowSchedule, check_official_l, check_schedule, make_schedule
from sjd.core.verify import VerifyResult, block_verify
from sjd.core.verify import verify as speculative_verify
from sjd.decoders.base import WINDOW_CAPABILITY, DecodeCall, Decoder, DecodeResult, ForwardClock
from sjd.models.base import ModelAdapter
from sjd.types import ImageLayout, Logits, Prompt

VERIFICATIONS = ("token", "block")


class SJDDecoder(Decoder):
    requires = WINDOW_CAPABILITY

    def __init__(
        self,
        name: str = "sjd",
        window: int = 16,
        init: str = "random",
        ar_prefix: int = 1,
        ar_suffix: int = 0,
        forced_drafts: bool = True,
        verification: str = "token",
        schedule: str = "harness",
        official_l: int = OFFICIAL_L,
    ) -> None:
        check_window_settings(window, ar_prefix, ar_suffix, schedule)
        if init not in SCHEMES + DISTRIBUTION_SCHEMES:
            raise ValueError(f"decoder.init must be one of {SCHEMES + DISTRIBUTION_SCHEMES}, got {init!r}")
        if verification not in VERIFICATIONS:
            raise ValueError(f"decoder.verification must be one of {VERIFICATIONS}, got {verification!r}")
        check_official_l(official_l)
        self.name, self.window, self.init = name, window, init
        self.ar_prefix, self.ar_suffix = ar_prefix, ar_suffix
        self.forced_drafts = forced_drafts
        self.verification = verification
        self.schedule, self.official_l = schedule, official_l

    def window_schedule(self, adapter: ModelAdapter) -> WindowSchedule:
        """The window rule on this model (the official one follows the adapter's model family)."""
        family = adapter.official_schedule
        return make_schedule(
            self.schedule, self.window, self.ar_prefix, self.ar_suffix, adapter.layout, family, self.official_l
        )

    def new_call(
        self, adapter: ModelAdapter, sampling: SamplingConfig, generators: Sequence[torch.Generator]
    ) -> WindowCall:
        """Everything one generate() call works with: a fresh clock and the window rule on this model."""
        return WindowCall(adapter, ForwardClock(adapter), sampling, generators, self.window_schedule(adapter))

    @staticmethod
    def widths(schedule: WindowSchedule, state: WindowState) -> list[int]:
        """Forward inputs for each row this iteration (0 for a complete row)."""
        return [schedule.width(n, prev) for n, prev in zip(state.committed, state.previous)]

    def check(self, adapter: ModelAdapter) -> None:
        super().check(adapter)
        self.window_schedule(adapter)  # an unknown official family fails at start-up
        check_window_fits(self.window, adapter)

    def generate(
        self,
        adapter: ModelAdapter,
        prompts: Sequence[Prompt],
        sampling: SamplingConfig,
        generators: Sequence[torch.Generator],
    ) -> DecodeResult:
        call = self.new_call(adapter, sampling, generators)
        clock, layout, device = call.clock, call.layout, call.device
        state = self.start(call, prompts)

        while True:
            widths = self.widths(call.schedule, state)
            if max(widths) == 0:
                break
            inputs, drafts, q = self.draft(state, widths, call)
            clock.lap("draft")
            # Output i of row b predicts position committed[b] + i.
            logits = clock.forward(inputs, [n - 1 for n in state.committed])
            positions = torch.as_tensor(state.committed, device=device)[:, None] + torch.arange(
                inputs.shape[1], device=device
            )
            p = logits_to_probs(logits, positions, layout, sampling)
            clock.lap("pipeline")
            result, samples, samples_q = self.verify(p, drafts, q, widths, positions, state, call)
            clock.lap("verify")
            state.commit(result, drafts, samples, p, widths, samples_q)
            self.after_commit(state, logits, self.committed_slots(inputs.shape[1], B=len(widths), device=device), call)
            clock.lap("commit")

        return state.finish(clock)

    # -- phases --------------------------------------------------------------------------------------
    def start(self, call: WindowCall, prompts: Sequence[Prompt]) -> WindowState:
        """Prefill and the first token as in AR, then the decoder's own per-call set-up (`begin`)."""
        state = self.new_state(len(prompts), call.layout, call.device)
        state.tokens[:, 0] = call.clock.start(prompts, call.sampling, call.generators)
        call.clock.defer_finite_check = True  # commit reads the accepted lengths and the NaN/inf flags in one copy
        state.read_counts = call.clock.read
        for b in range(len(prompts)):  # where position 0 is a code (LlamaGen), the row below may draw from its p
            state.remember_p(b, 0, call.clock.first_p[b : b + 1])
        self.begin(state, call)
        return state

    def new_state(self, B: int, layout: ImageLayout, device: torch.device) -> WindowState:
        """Empty per-row state; vertical_dist drafts also need the last row_stride committed p."""
        keep_p = layout.row_stride if self.init in DISTRIBUTION_SCHEMES else 0
        return WindowState.empty(B, layout.n_tokens, layout.vocab_size, device, keep_p)

    def begin(self, state: WindowState, call: WindowCall) -> None:
        """Per-call set-up after the first token (coupled decoders draw their noise tables here)."""

    def after_commit(self, state: WindowState, logits: Logits, slots: torch.Tensor, call: WindowCall) -> None:
        """After each commit: row b committed the tokens at positions state.previous[b] .. committed[b] - 1, and
        window slot `slots[b, a]` holds the input before the a-th of them (the target's features there are in
        `logits.features`). Decoders that draft with a trained drafter continue their drafts here."""

    @staticmethod
    def committed_slots(width: int, B: int, device: torch.device) -> torch.Tensor:
        """[B, width]: in an SJD window, slot a holds the input at position committed - 1 + a."""
        return torch.arange(width, device=device).expand(B, width)

    def draft(
        self, state: WindowState, widths: list[int], call: WindowCall
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Window inputs [B, W] = [last committed, drafts...], drafts [B, W-1] and their q."""
        layout, generators = call.layout, call.generators
        B, W, V, device = len(widths), max(widths), layout.vocab_size, state.tokens.device
        drafts = torch.zeros(B, W - 1, dtype=torch.long, device=device)
        q = torch.zeros(B, W - 1, V, device=device)
        inputs = torch.zeros(B, W, dtype=torch.long, device=device)
        for b in range(B):
            n, need = state.committed[b], max(widths[b] - 1, 0)
            d, dq = self.top_up(state, b, need, layout, generators[b])
            drafts[b, :need], q[b, :need] = d, dq
            inputs[b, 0] = state.tokens[b, min(n, layout.n_tokens) - 1]
            inputs[b, 1 : 1 + need] = d
        return inputs, drafts, q

    def top_up(
        self, state: WindowState, b: int, need: int, layout: ImageLayout, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Row b's carried drafts for its next `need` positions, topped up with fresh ones, and their q."""
        n = state.committed[b]
        d, dq = state.carried[b][:need], state.carried_q[b][:need]
        if len(d) == need:
            return d, dq
        # Spatial schemes read the row's current tokens; random needs none (keep the hot path light).
        known = d if self.init == "random" else torch.cat([state.tokens[b, :n], d])
        start, count = n + len(d), need - len(d)
        if self.init in DISTRIBUTION_SCHEMES:
            noise = state.noise[b] if state.noise is not None else None  # Gumbel coupling's vectors
            new, new_q = distribution_drafts(
                known, start, count, layout, generator, n, state.committed_p[b], noise, self.forced_drafts
            )
        else:
            left = dq[-1] if len(d) else state.last_p[b]  # what position start - 1 was drawn from
            new = fresh_drafts(self.init, known, start, count, layout, generator, left, self.forced_drafts)
            new_q = one_hot(new, layout.vocab_size)
        return torch.cat([d, new]), torch.cat([dq, new_q])

    def verify(
        self,
        p: torch.Tensor,
        drafts: torch.Tensor,
        q: torch.Tensor,
        widths: list[int],
        positions: torch.Tensor,
        state: WindowState,
        call: WindowCall,
    ) -> tuple[VerifyResult, torch.Tensor, torch.Tensor]:
        """Speculative rule (sjd.core.verify), plus one new draft per slot and its q (`next_drafts`)."""
        n_drafts = torch.tensor([max(w - 1, 0) for w in widths], device=p.device)
        u_accept, u_jacobi = draw_uniforms(call.generators, widths, p.shape[1], p.device)
        u_final = u_accept.gather(1, n_drafts[:, None]).squeeze(1)  # each row's own last uniform
        result = self.accept(p, drafts, q, n_drafts, u_accept[:, :-1], u_final, call)
        samples, samples_q = self.next_drafts(p, drafts, q, n_drafts, result, u_jacobi, positions, state)
        return result, samples, samples_q

    def accept(
        self,
        p: torch.Tensor,
        drafts: torch.Tensor,
        q: torch.Tensor,
        n_drafts: torch.Tensor,
        accept_uniforms: torch.Tensor,
        sample_uniforms: torch.Tensor,
        call: WindowCall,
    ) -> VerifyResult:
        """The acceptance rule: exact speculative sampling, token by token or for the block as a
        whole (relaxed decoders replace it)."""
        rule = block_verify if self.verification == "block" else speculative_verify
        return rule(p, drafts, q, n_drafts, accept_uniforms, sample_uniforms)

    def next_drafts(
        self,
        p: torch.Tensor,
        drafts: torch.Tensor,
        q: torch.Tensor,
        n_drafts: torch.Tensor,
        result: VerifyResult,
        uniforms: torch.Tensor,
        positions: torch.Tensor,
        state: WindowState,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, W] the drafts the slots carry into the next iteration and [B, W, V] the
        distributions they are drawn from given everything verification has seen (their q).
        SJD draws them from p independently of the old drafts (the Jacobi update); coupled
        decoders (sjd.decoders.coupled) correlate them with the old ones."""
        return sample_from(p, uniforms), p


@dataclass
class WindowCall(DecodeCall):
    """A window decoder's call: its window rule on this model too."""

    schedule: WindowSchedule


def check_window_settings(window: int, ar_prefix: int, ar_suffix: int, schedule: str) -> None:
    """The window settings every window decoder takes, checked when it is built."""
    if window < 1:
        raise ValueError(f"decoder.window must be >= 1, got {window}")
    if ar_prefix < 1 or ar_suffix < 0:
        raise ValueError(f"decoder.ar_prefix must be >= 1 and decoder.ar_suffix >= 0, got {ar_prefix}, {ar_suffix}")
    check_schedule(schedule)


def check_window_fits(window: int, adapter: ModelAdapter) -> None:
    if window > adapter.layout.n_tokens:
        raise ValueError(
            f"decoder.window={window} is larger than the {adapter.layout.n_tokens} tokens of a {adapter.name} image"
        )


@dataclass
class WindowState:
    """Per row: the output buffer, how much is committed, and the drafts carried past it."""

    tokens: torch.Tensor  # [B, N]
    committed: list[int]
    previous: list[int]  # committed before the last commit (0 before the prefill's token)
    carried: list[torch.Tensor]  # drafts for positions committed[b], committed[b] + 1, ...
    carried_q: list[torch.Tensor]  # ... and the distributions they were drawn from
    accepted: list[list[int]]
    n_forward: list[int]
    last_p: list[torch.Tensor | None]  # the distribution the last committed token was drawn from
    noise: torch.Tensor | None = None  # per-position coupling noise of coupled decoders [B, N, V]
    committed_p: torch.Tensor | None = None  # [B, K, V]: p of the last K committed positions, at pos % K
    inputs: list[int] | None = None  # window inputs forwarded after the prefill (the forwards' compute)
    drafter_forwards: torch.Tensor | None = None  # [B] a trained drafter's forwards per row (sjd.decoders.drafted)
    read_counts: Callable[[torch.Tensor], list[int]] = torch.Tensor.tolist  # brings per-row counts to the host

    @classmethod
    def empty(cls, B: int, N: int, V: int, device: torch.device, keep_p: int = 0) -> WindowState:
        return cls(
            tokens=torch.empty(B, N, dtype=torch.long, device=device),
            committed=[1] * B,
            previous=[0] * B,
            carried=[torch.empty(0, dtype=torch.long, device=device)] * B,
            carried_q=[torch.empty(0, V, device=device)] * B,
            accepted=[[1] for _ in range(B)],
            n_forward=[1] * B,
            last_p=[None] * B,
            committed_p=torch.zeros(B, keep_p, V, device=device) if keep_p else None,
            inputs=[0] * B,
        )

    def remember_p(self, b: int, start: int, p: torch.Tensor) -> None:
        """Keep p [k, V] of row b's positions start .. start+k-1 (when the decoder asked for them)."""
        if self.committed_p is None:
            return
        K = self.committed_p.shape[1]
        first = max(start, start + len(p) - K)  # only the last K can still be needed
        self.committed_p[b, torch.arange(first, start + len(p)) % K] = p[first - start :]

    def commit(
        self,
        result: VerifyResult,
        drafts: torch.Tensor,
        samples: torch.Tensor,
        p: torch.Tensor,
        widths: list[int],
        samples_q: torch.Tensor | None = None,
        end_row: Callable[[int, int, int], int] | None = None,
    ) -> None:
        """Accepted drafts + the next token; the later samples carry over with their q, which is
        p unless a coupled decoder says otherwise (one host sync). `widths[b]` is how many window
        slots of row b hold samples (0: the row is complete). `end_row(b, n, n_accepted)` writes
        what follows row b's accepted drafts and returns how many tokens the forward commits in
        all (default `end_with_next_token`); the branching decoder commits a sibling there."""
        samples_q = p if samples_q is None else samples_q
        for b, n_acc in enumerate(self.read_counts(result.n_accepted)):
            if widths[b] == 0:
                continue
            n = self.committed[b]
            self.tokens[b, n : n + n_acc] = drafts[b, :n_acc]
            self.remember_p(b, n, p[b, : n_acc + 1])  # the accepted drafts' and the next token's p
            if end_row is None:
                take = self.end_with_next_token(b, n, n_acc, result.next_token[b], p[b, n_acc])
            else:
                take = end_row(b, n, n_acc)
            self.previous[b], self.committed[b] = n, n + take
            self.carried[b], self.carried_q[b] = samples[b, take : widths[b]], samples_q[b, take : widths[b]]
            self.accepted[b].append(take)
            self.n_forward[b] += 1
            self.inputs[b] += widths[b]

    def finish(self, clock: ForwardClock) -> DecodeResult:
        """The call's result, with each row's window inputs in its extras."""
        result = clock.finish(self.tokens, self.n_forward, self.accepted)
        result.extras["window_inputs"] = list(self.inputs)
        if self.drafter_forwards is not None:
            result.extras["drafter_forwards"] = self.drafter_forwards.tolist()
        return result

    def end_with_next_token(self, b: int, n: int, n_acc: int, token: torch.Tensor, p: torch.Tensor) -> int:
        """The usual end of a commit: the residual (or bonus) token after the accepted drafts, drawn from p."""
        self.tokens[b, n + n_acc] = token
        self.last_p[b] = p  # the residual's source; its arg-max is what sample_horizon wants
        return n_acc + 1


def draw_uniforms(
    generators: Sequence[torch.Generator], widths: list[int], W: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, `widths[b]` uniforms for acceptance (+ the residual/bonus draw) and as many for
    the Jacobi samples, padded to W. Each row draws only what its own window needs, so its
    random stream, and hence its tokens, do not depend on the other rows of the batch."""
    u = torch.zeros(len(widths), 2, W, device=device)
    for b, (g, w) in enumerate(zip(generators, widths)):
        if w:
            u[b, :, :w] = torch.rand(2, w, generator=g, device=device)
    return u[:, 0], u[:, 1]
