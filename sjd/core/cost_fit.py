"""The cost model's fitted constants, from GPU timings: pure arithmetic over `Timing`s, no file and no torch.

A timing is one measured time per forward on a GPU: a bare forward (`window` tokens at a context, no decoder), or
a decode's time per forward with the decoder's own operator calls and host syncs per iteration. Each is priced as
sjd.core.cost prices it, so a fit and a prediction use the very formula the pages use:

- eager: `op_s` (the host time of one operator call) and `peak_reached` (the share of the datasheet bf16 peak a
  forward's matmuls reach) minimise the squared relative error over the eager timings not held out: a grid over
  `peak_reached`, and for each the least-squares `op_s`, which is closed-form because a modelled time is affine
  in it;
- compiled: `forward_s` (one forward's host time as a whole) the same way over the compiled timings not held out,
  at the fitted `peak_reached`;
- `op_s_range`: the `op_s` each eager timing not held out implies alone, lowest to highest: how far the timings
  disagree with one constant, the range a verdict must hold over.

Held-out timings (a decoder the fit never saw) are priced with the fitted constants and reported beside the
fitted ones: their relative error is the model's out-of-sample error on our own GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from sjd.core.cost import (
    ENGINES,
    GPU,
    Architecture,
    DecodeCounts,
    decode_seconds,
)

PEAK_GRID = np.round(np.arange(0.05, 1.0001, 0.01), 2)  # the shares of the peak the eager fit tries


@dataclass(frozen=True)
class Timing:
    """One measured time per forward: `width` tokens on each of `rows` cache rows at `context` generated tokens, on
    `engine` (eager or compiled), with the decoder's own calls and host syncs per iteration (none for a bare
    forward)."""

    label: str
    engine: str
    rows: int
    width: int
    context: float
    seconds: float
    decoder_ops: float = 0.0
    syncs: float = 0.0
    held_out: bool = False


@dataclass(frozen=True)
class Fit:
    """The fitted constants and every timing's modelled time under them (`residuals`: label, engine, held out,
    measured and modelled seconds)."""

    op_s: float
    peak_reached: float
    forward_s: float
    op_s_range: tuple[float, float]
    residuals: list[tuple[str, str, bool, float, float]]

    def errors(self, held_out: bool) -> list[float]:
        """The relative errors (modelled over measured, less 1) of the held-out timings, or of the fitted ones."""
        return [m / s - 1 for _, _, h, s, m in self.residuals if h == held_out]


def modelled_seconds(timing: Timing, arch: Architecture, gpu: GPU, op_s: float, forward_s: float) -> float:
    """A timing's modelled time per forward under these constants (`gpu` carries the peak reached)."""
    engine = replace(ENGINES[timing.engine], op_s=op_s) if timing.engine == "eager" else ENGINES[timing.engine]
    if timing.engine == "compiled":
        engine = replace(engine, forward_s=forward_s)
    counts = DecodeCounts(1.0, timing.context, timing.width, decoder_ops=timing.decoder_ops, syncs=timing.syncs)
    return decode_seconds(counts, arch, gpu, engine, timing.rows)


def affine(timing: Timing, arch: Architecture, gpu: GPU, forward_s: float) -> tuple[float, float]:
    """(a, b) with modelled seconds = a + b * op_s for an eager timing (b: its calls, the forward's and its own)."""
    at_zero = modelled_seconds(timing, arch, gpu, 0.0, forward_s)
    return at_zero, modelled_seconds(timing, arch, gpu, 1.0, forward_s) - at_zero


def least_squares(pairs: Sequence[tuple[float, float]], measured: Sequence[float]) -> float:
    """The x minimising sum(((a + b x) / y - 1)^2) over the (a, b) pairs and measured y."""
    a, b, y = (np.asarray(v, dtype=float) for v in (*zip(*pairs), measured))
    return float(np.sum(b / y * (1 - a / y)) / np.sum((b / y) ** 2))


def fit_constants(timings: Sequence[Timing], arch: Architecture, gpu: GPU) -> Fit:
    """Fit op_s and peak_reached on the eager timings not held out, then forward_s on the compiled ones (module
    docstring). Raises ValueError naming what is missing where a kind of timing has nothing to fit on."""
    eager = [t for t in timings if t.engine == "eager" and not t.held_out]
    compiled = [t for t in timings if t.engine == "compiled" and not t.held_out]
    if not eager or not compiled:
        raise ValueError("fit_constants needs eager and compiled timings to fit on (results/gpu_forward_latency.csv)")
    best = None
    for peak in PEAK_GRID:
        reached = replace(gpu, peak_reached=float(peak))
        pairs = [affine(t, arch, reached, 0.0) for t in eager]
        op_s = least_squares(pairs, [t.seconds for t in eager])
        loss = sum(((a + b * op_s) / t.seconds - 1) ** 2 for (a, b), t in zip(pairs, eager))
        if best is None or loss < best[0] - 1e-15:
            best = (loss, float(peak), op_s)
    _, peak, op_s = best
    reached = replace(gpu, peak_reached=peak)
    bare = [modelled_seconds(t, arch, reached, op_s, 0.0) for t in compiled]
    forward_s = least_squares([(a, 1.0) for a in bare], [t.seconds for t in compiled])
    alone = [(t.seconds - a) / b for t in eager for a, b in [affine(t, arch, reached, 0.0)]]
    residuals = [(t.label, t.engine, t.held_out, t.seconds, modelled_seconds(t, arch, reached, op_s, forward_s))
                 for t in timings]  # fmt: skip
    return Fit(op_s, peak, forward_s, (min(alone), max(alone)), residuals)
