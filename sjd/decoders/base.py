"""What every decoder shares: the result record, capability checks and forward accounting.

A decoder is built from its config (`conf/decoder/*.yaml`) and runs
`generate(adapter, prompts, sampling, generators) -> DecodeResult`. It owns its loop and
talks to the model only through the adapter protocol (sjd.models.base).
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, is_dataclass

import torch

from sjd.core.sampling import SamplingConfig, logits_to_probs, sample_rows
from sjd.decoders.kernels import EAGER, Kernels, compiled_kernels
from sjd.decoders.stages import StageClock
from sjd.models.base import ModelAdapter
from sjd.types import WINDOW, ImageLayout, Logits, Prompt


@dataclass
class DecodeResult:
    tokens: torch.Tensor  # [B, n_tokens] generated ids (CPU)
    n_forward: list[int]  # forwards until each row was complete (prefill counted)
    accepted: list[list[int]]  # per row: tokens committed by each of its forwards
    prefill_s: float = 0.0
    decode_s: float = 0.0  # the decode loop after prefill
    model_s: float = 0.0  # time inside model forwards (prefill included)
    stage_s: dict[str, float] = field(default_factory=dict)  # decode_s split by stage (sjd.decoders.stages)
    extras: dict = field(default_factory=dict)
    # per row: mean entropy (nats) of the sampling distribution over code positions, where the decoder
    # measures it (AR does); None elsewhere
    entropy_nats: list[float] | None = None
    # seconds of work the adapter set aside as not the timed model's (a shadowed run's stand-in calls:
    # ForwardClock.set_aside), already left out of prefill_s, decode_s, model_s and stage_s
    set_aside_s: float = 0.0

    @property
    def latency_s(self) -> float:
        return self.prefill_s + self.decode_s


def device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def finite_rows(logits: Logits) -> torch.Tensor:
    """[B] bool, on the device: whether every logit of each row, in both CFG branches, is finite (one reduction
    a row; a NaN or inf makes the sum NaN or inf)."""
    total = logits.cond.flatten(1).sum(1, dtype=torch.float32)
    if logits.uncond is not None:
        total = total + logits.uncond.flatten(1).sum(1, dtype=torch.float32)
    return torch.isfinite(total)


def nonfinite_error(model: str, rows: list[str], step: int, branch: str = "") -> FloatingPointError:
    return FloatingPointError(
        f"model {model!r} returned NaN/inf {branch + ' ' if branch else ''}logits for prompt(s) {rows} at forward "
        f"{step} (1 = prefill); samples finished before this batch are kept"
    )


def check_finite(logits: Logits, model: str, prompt_ids: Sequence[str], step: int) -> None:
    """A NaN or inf logit would silently turn into a wrong token; stop and name where it came from.

    One reduction a row over both CFG branches (finite_rows) and one read of it (a host sync on a GPU); only a
    non-finite sum (or one that overflows) pays for the scan that names the branch and the rows."""
    if bool(finite_rows(logits).all()):
        return
    for branch, t in (("conditional", logits.cond), ("unconditional", logits.uncond)):
        bad = (~torch.isfinite(t)).flatten(1).any(1) if t is not None else None
        if bad is not None and bool(bad.any()):
            rows = [prompt_ids[i] if i < len(prompt_ids) else str(i) for i in bad.nonzero().flatten().tolist()]
            raise nonfinite_error(model, rows, step, branch)


class ForwardClock:
    """Counts and times the model calls of one generate(), so decoder bookkeeping is visible.

    On a GPU each call is bracketed by two CUDA events and nothing waits for them: `model_s` resolves them when it
    is read after the decode, once the device is idle. So the clock adds no host sync to the loop (the one a window
    decoder needs is its read of the accepted lengths), and `model_s` is the GPU's own time inside the calls.

    Every forward's logits are checked for NaN/inf. By default the check reads its flag at once (one sync a
    forward); a decoder that reads a per-row count after every forward anyway sets `defer_finite_check` and
    reads its counts through `read`, which brings the flags of every forward since the last read to the host
    in the same copy: one sync for both.

    The clock tells the adapter it times it (`ModelAdapter.timed_by`). An adapter whose calls hold work that is not
    the timed model's (a shadowed run's stand-in, sjd/models/shadow.py) runs that work inside `set_aside`, which
    leaves it out of prefill_s, decode_s, model_s and the stages and reports it as set_aside_s."""

    def __init__(self, adapter: ModelAdapter) -> None:
        self.adapter = adapter
        self._model_s = 0.0
        self._forward_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []  # GPU: not yet resolved
        self.calls = 0
        self.prompt_ids: list[str] = []
        self.stages = StageClock(adapter.device)
        self.defer_finite_check = False
        self.unread: list[tuple[int, torch.Tensor]] = []  # (forward, finite_rows) not yet brought to the host
        self._in_call = False  # inside a bracketed model call
        self._aside = {"prefill": 0.0, "decode": 0.0, "in_calls": 0.0}  # set-aside seconds by where they fell
        self._aside_events: list[tuple[torch.cuda.Event, torch.cuda.Event, str, bool]] = []  # GPU: not yet resolved
        adapter.timed_by(self)

    def lap(self, stage: str) -> None:
        """The decode time since the previous lap went to `stage` (sjd.decoders.stages.STAGES)."""
        self.stages.lap(stage)

    @property
    def model_s(self) -> float:
        """Seconds inside the model calls so far, less what was set aside in them. On a GPU, read it after the
        decode: it waits for the last call's event (finish has synchronised the device by then) and resolves them
        all."""
        if self._forward_events:
            self._forward_events[-1][1].synchronize()
            self._model_s += sum(start.elapsed_time(end) for start, end in self._forward_events) / 1000
            self._forward_events = []
        return self._model_s - self.aside_seconds()["in_calls"]

    @contextlib.contextmanager
    def set_aside(self) -> Iterator[None]:
        """Work inside is not the timed model's (a shadowed run's stand-in call): its seconds leave prefill_s or
        decode_s (whichever phase it falls in), model_s when it runs inside a model call, and the stage it ran in.
        On a GPU its span is timed by two CUDA events that nothing waits for (the stream time it took, idle gaps
        waiting for its launches included), resolved after the decode."""
        phase, in_call = ("decode" if self.stages.running else "prefill"), self._in_call
        self.stages.pause()
        try:
            if self.adapter.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                try:
                    yield
                finally:
                    end.record()
                    self._aside_events.append((start, end, phase, in_call))
            else:
                t0 = time.perf_counter()
                try:
                    yield
                finally:
                    self._add_aside(time.perf_counter() - t0, phase, in_call)
        finally:
            self.stages.resume()

    def _add_aside(self, seconds: float, phase: str, in_call: bool) -> None:
        self._aside[phase] += seconds
        if in_call:
            self._aside["in_calls"] += seconds

    def aside_seconds(self) -> dict[str, float]:
        """Set-aside seconds so far: in the prefill, in the decode, and the part of both inside model calls. On a GPU,
        read it after the decode (it resolves the events, waiting for the last)."""
        if self._aside_events:
            self._aside_events[-1][1].synchronize()
            for start, end, phase, in_call in self._aside_events:
                self._add_aside(start.elapsed_time(end) / 1000, phase, in_call)
            self._aside_events = []
        return dict(self._aside)

    def _timed(self, fn, *args) -> Logits:
        self.stages.lap("other")
        self._in_call = True
        if self.adapter.device.type == "cuda":  # CUDA events: the GPU's own clock around the call, read later
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args)
            end.record()
            self._forward_events.append((start, end))
        else:
            t0 = time.perf_counter()
            out = fn(*args)
            self._model_s += time.perf_counter() - t0
        self._in_call = False
        self.stages.lap("forward")  # the finite check below is the logits pipeline's
        self.calls += 1
        if self.defer_finite_check:
            self.unread.append((self.calls, finite_rows(out)))
        else:
            check_finite(out, self.adapter.name, self.prompt_ids, self.calls)
        return out

    def read(self, counts: torch.Tensor) -> list[int]:
        """`counts` [B] on the host, with the NaN/inf flags of the forwards since the last read in the same copy;
        raises as check_finite does, naming the first forward and the rows whose logits were not finite."""
        values = torch.cat([counts.long().flatten(), *(flags.long() for _, flags in self.unread)]).tolist()
        n, unread, self.unread = counts.numel(), self.unread, []
        for i, (step, flags) in enumerate(unread):
            ok = values[n + i * len(flags) : n + (i + 1) * len(flags)]
            bad = [self.prompt_ids[r] if r < len(self.prompt_ids) else str(r) for r, f in enumerate(ok) if not f]
            if bad:
                raise nonfinite_error(self.adapter.name, bad, step)
        return values[:n]

    def prefill(self, prompts: Sequence[Prompt], with_uncond: bool) -> Logits:
        self.prompt_ids = [p.prompt_id for p in prompts]
        return self._timed(self.adapter.prefill, prompts, with_uncond)

    def start(
        self, prompts: Sequence[Prompt], sampling: SamplingConfig, generators: Sequence[torch.Generator]
    ) -> torch.Tensor:
        """Start the clock, prefill, and sample generated position 0 of every row as AR does (from
        `first_p`, kept for decoders that remember committed distributions)."""
        self.t0 = time.perf_counter()
        logits = self.prefill(prompts, sampling.uses_uncond)
        self.prefill_features = logits.features  # the prompt's hidden states, for a drafter (None without)
        zero = torch.zeros(len(prompts), 1, dtype=torch.long, device=self.adapter.device)
        self.first_p = logits_to_probs(logits, zero, self.adapter.layout, sampling)[:, 0]  # [B, V]
        first = sample_rows(self.first_p, generators)
        self.t_prefill = time.perf_counter() - self.t0
        self.stages.begin()
        return first

    def finish(
        self, tokens: torch.Tensor, n_forward: list[int], accepted: list[list[int]], measured_s: float = 0.0
    ) -> DecodeResult:
        """Stop the clock (after the device is idle) and package the result. `measured_s`: seconds of the decode
        spent measuring, not decoding (AR's entropy), kept out of `decode_s` (and of the stages, which the
        measurement left with `stages.exclude`)."""
        if self.unread:  # flags no count has brought to the host yet
            self.read(torch.zeros(0, dtype=torch.long, device=self.adapter.device))
        device_sync(self.adapter.device)
        aside = self.aside_seconds()
        decode_s = time.perf_counter() - self.t0 - self.t_prefill - measured_s - aside["decode"]
        self.adapter.timed_by(None)
        return DecodeResult(
            tokens=tokens.cpu(),
            n_forward=n_forward,
            accepted=accepted,
            prefill_s=self.t_prefill - aside["prefill"],
            decode_s=decode_s,
            model_s=self.model_s,
            stage_s=self.stages.split(decode_s),
            extras={"stage_laps": self.stages.n_laps},
            set_aside_s=aside["prefill"] + aside["decode"],
        )

    def forward(self, tokens: torch.Tensor, start: Sequence[int]) -> Logits:
        return self._timed(self.adapter.forward, tokens, start)

    def forward_embeds(self, embeds: torch.Tensor, levels: torch.Tensor, start: Sequence[int]) -> Logits:
        return self._timed(self.adapter.forward_embeds, embeds, levels, start)

    def forward_at(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        keep: torch.Tensor,
        window_mask: torch.Tensor,
        transient: torch.Tensor | None = None,
    ) -> Logits:
        return self._timed(self.adapter.forward_at, tokens, positions, keep, window_mask, transient)


@dataclass
class DecodeCall:
    """What one generate() call works with. The phases of a decoder receive it (as gpt-fast's steps
    receive `input_pos`), so the decoder object holds its settings and nothing of any one call."""

    adapter: ModelAdapter
    clock: ForwardClock
    sampling: SamplingConfig
    generators: Sequence[torch.Generator]

    @property
    def layout(self) -> ImageLayout:
        return self.adapter.layout

    @property
    def device(self) -> torch.device:
        return self.adapter.device


class Decoder(ABC):
    name: str = "decoder"
    requires: frozenset[str] = frozenset()
    lossless: bool = True  # whether its samples are distributed exactly as AR's
    _kernels: Kernels = EAGER  # the pipeline, verification and sampling it calls (sjd.decoders.kernels)

    @property
    def kernels(self) -> Kernels:
        """The iteration kernels this decoder calls: eager, or compiled under compile=true."""
        return self._kernels

    def compile_kernels(self, mode: str | None, backend: str | None = None) -> None:
        """compile=true: the pipeline, verification and sampling as compiled graphs (torch.compile's `mode`)."""
        self._kernels = compiled_kernels(mode, backend)

    def use_kernels(self, kernels: Kernels) -> None:
        """Another kernel set (the sync counter's, which counts each call as one graph replay)."""
        self._kernels = kernels

    def check(self, adapter: ModelAdapter) -> None:
        """Fail at start-up, naming decoder, model and capability, if the model lacks one."""
        missing = sorted(self.requires - adapter.capabilities)
        if missing:
            raise ValueError(
                f"decoder {self.name!r} needs model capabilities {missing}, which model "
                f"{adapter.name!r} does not provide (it has {sorted(adapter.capabilities)})"
            )

    def networks(self, adapter: ModelAdapter) -> dict[str, torch.nn.Module]:
        """Networks of its own the decoder decodes with (a trained drafter), by role; hashed into every results
        row beside the model's (`weights_sha`)."""
        return {}

    def config(self) -> dict:
        """The decoder's settings, recorded in every results row: every field of its settings dataclass, those a
        subclass fixes (`init=False`, e.g. Jacobi's `verification`) included."""
        if not is_dataclass(self):
            raise TypeError(
                f"decoder class {type(self).__name__} must be a dataclass (@dataclass(eq=False, kw_only=True)) whose "
                "fields are its settings (docs/adding-a-decoder.md)"
            )
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @abstractmethod
    def generate(
        self,
        adapter: ModelAdapter,
        prompts: Sequence[Prompt],
        sampling: SamplingConfig,
        generators: Sequence[torch.Generator],
    ) -> DecodeResult: ...


WINDOW_CAPABILITY = frozenset({WINDOW})
