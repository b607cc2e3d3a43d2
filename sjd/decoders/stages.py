"""Where a decode loop's wall time goes: draft, model forward, logits pipeline, verify, commit.

A decoder marks the end of each named phase with `lap(stage)`: the time since the previous lap
goes to that stage. Laps are one clock read each (one recorded CUDA event on a GPU, resolved
once at the end, so no lap synchronises the device), which is why decoders mark phases with
laps rather than timing blocks. The forward clock laps "other" before and "forward" after every
model call, so whatever a decoder leaves unlabelled before a forward lands in "other".
"""

from __future__ import annotations

import time

import torch

STAGES = ("draft", "drafter", "forward", "pipeline", "verify", "commit", "other")
"""draft: window inputs, drafts and their q. drafter: a trained drafter's own forwards (its network, the
target's head on its features and the pipeline that makes q). forward: the model call. pipeline: the finite check
and logits -> probabilities. verify: deciding tokens from p (acceptance rule, residual and next
drafts; AR's sample). commit: writing the decision into the decoder's state. other: the rest of
the decode wall time (loop control, windows, lap overhead)."""

PAUSE, RESUME = "(pause)", "(resume)"  # CUDA event marks of a paused span (StageClock.pause), never a stage


class StageClock:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.running = False
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self._events: list[tuple[str, torch.cuda.Event]] = []
        self._last = 0.0
        self._paused_at = 0.0
        self.n_laps = 0  # what the instrumentation itself costs is n_laps times one lap (scripts/bench_pipeline.py)

    def begin(self) -> None:
        """Start at the top of the decode loop (after prefill)."""
        self.running = True
        if self.cuda:
            self._events = [("", self._record())]
        else:
            self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        """The time since the previous lap was spent in `stage`."""
        if not self.running:
            return
        self.n_laps += 1
        if self.cuda:
            self._events.append((stage, self._record()))
        else:
            now = time.perf_counter()
            self.seconds[stage] += now - self._last
            self._last = now

    def exclude(self) -> None:
        """The time since the previous lap was measurement, not decoding: it goes to no stage (the
        decoder also leaves it out of its decode time)."""
        if not self.running:
            return
        if self.cuda:
            self._events.append(("", self._record()))
        else:
            self._last = time.perf_counter()

    def pause(self) -> None:
        """Stop the clock until `resume`: the span between goes to no stage, and the stage the next lap names
        keeps the time before and after it (work set aside inside a phase: a shadowed run's stand-in calls)."""
        if not self.running:
            return
        if self.cuda:
            self._events.append((PAUSE, self._record()))
        else:
            self._paused_at = time.perf_counter()

    def resume(self) -> None:
        if not self.running:
            return
        if self.cuda:
            self._events.append((RESUME, self._record()))
        else:
            self._last += time.perf_counter() - self._paused_at

    def split(self, decode_s: float) -> dict[str, float]:
        """Seconds per stage over a decode loop of `decode_s` wall seconds; "other" takes the rest,
        so the stages sum to decode_s. Call after the device is idle."""
        self.running = False
        if self.cuda:  # the GPU timeline between consecutive laps, idle gaps waiting for the host included
            before_pause = 0.0  # a stage's time before a pause, which the stage its next lap names keeps
            for (_, before), (stage, after) in zip(self._events, self._events[1:]):
                span = before.elapsed_time(after) / 1000
                if stage == PAUSE:
                    before_pause += span
                elif stage == RESUME:  # the paused span itself
                    continue
                else:
                    if stage:  # "" marks an excluded span
                        self.seconds[stage] += before_pause + span
                    before_pause = 0.0
            self._events = []
        named = sum(v for k, v in self.seconds.items() if k != "other")
        self.seconds["other"] = max(decode_s - named, 0.0) if decode_s > 0 else 0.0
        return dict(self.seconds)

    @staticmethod
    def _record() -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
