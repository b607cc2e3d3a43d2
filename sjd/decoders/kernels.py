"""The tensor work of an iteration outside the model forward, eager or compiled.

Beside the model forward, every iteration runs the shared logits pipeline, a verification rule and inverse-CDF
sampling. Eager, each is tens of operator calls, and on a GPU each call is a kernel launch of a few microseconds,
beside a 7B forward of a few milliseconds (results/syncs.csv counts them per decoder, eager and compiled).

Under compile=true the runner compiles these too (`Decoder.compile_kernels`), each into one graph: `fullgraph`, so
a graph break is an error here rather than a silent split into many. With torch.compile's `reduce-overhead` mode
(the default on CUDA) a call is then one CUDA graph replay, after copying its tensor inputs into the graph's own
buffers. Randomness never enters a graph: every uniform is drawn outside, from the per-prompt generators, so the
compiled and eager kernels see the same draws.

What is compiled:
- the logits pipeline's tensor part (sjd.core.sampling.probs_on_free_columns; the layout's tables are read on
  the host side, once per model);
- token and block verification (sjd.core.verify.verify, block_verify), returned as a VerifyResult;
- sampling from p (sjd.core.sampling.sample_from): the Jacobi update's next drafts and AR's token.

A decoder calls them through `self.kernels`; which decoders do is listed in docs/algorithms.md (compiled
iteration kernels). The rest of an iteration (drafting, committing, trees) stays eager.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sjd.core.sampling import SamplingConfig, logits_to_probs, probs_on_free_columns, sample_from
from sjd.core.verify import VerifyResult, block_verify, verify
from sjd.models.causal_lm import RECOMPILE_LIMIT, compile_options, uses_cuda_graphs
from sjd.types import ImageLayout, Logits


def _verify_parts(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    result = verify(*args)
    return result.n_accepted, result.next_token, result.accepted


def _block_verify_parts(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    result = block_verify(*args)
    return result.n_accepted, result.next_token, result.accepted


def eager(fn: Callable) -> Callable:
    return fn


@dataclass(frozen=True, eq=False)
class Kernels:
    """How a decoder runs the pure tensor functions of its iteration: `kernels(fn)` is `fn` through `wrap`, made
    once per function: as is (`EAGER`), compiled into one graph (`compiled_kernels`), or counted as one CUDA graph
    replay (the sync counter's, sjd.bench.syncs). A function given here must be pure tensor work (no host read,
    no randomness, no Python state), which fullgraph compiling checks."""

    wrap: Callable[[Callable], Callable] = eager
    compiled: bool = False  # whether `wrap` compiles (tests/models/test_compile.py checks a decoder runs these)
    _made: dict = field(default_factory=dict, repr=False)

    def __call__(self, fn: Callable) -> Callable:
        if fn not in self._made:
            self._made[fn] = self.wrap(fn)
        return self._made[fn]

    def pipeline(
        self, logits: Logits, positions: torch.Tensor, layout: ImageLayout, sampling: SamplingConfig
    ) -> torch.Tensor:
        """sjd.core.sampling.logits_to_probs, its tensor part through this kernel set."""
        return logits_to_probs(logits, positions, layout, sampling, self(probs_on_free_columns))

    def verify(self, *args: torch.Tensor) -> VerifyResult:
        """sjd.core.verify.verify (same arguments)."""
        return VerifyResult(*self(_verify_parts)(*args))

    def block_verify(self, *args: torch.Tensor) -> VerifyResult:
        """sjd.core.verify.block_verify (same arguments)."""
        return VerifyResult(*self(_block_verify_parts)(*args))

    def sample_from(self, probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
        """sjd.core.sampling.sample_from."""
        return self(sample_from)(probs, uniforms)


EAGER = Kernels()


@functools.cache
def compiled_kernels(mode: str | None, backend: str | None = None) -> Kernels:
    """Kernels compiled with torch.compile's `mode` into one graph each (fullgraph), once per process and mode;
    each shape compiles on first use (the runner's warm-up batch meets the shapes a run uses). Every window width,
    batch size and decoder setting is a graph of its own, so dynamo's recompile limit is raised as for the
    compiled windows (sjd.models.causal_lm.RECOMPILE_LIMIT)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    compile_one = functools.partial(torch.compile, fullgraph=True, **compile_options(mode, backend))
    if uses_cuda_graphs(mode) and backend in (None, "inductor"):  # a replay's outputs are overwritten by the next
        return Kernels(lambda fn: kept_outputs(compile_one(fn)), compiled=True)
    return Kernels(compile_one, compiled=True)


def kept_outputs(compiled: Callable) -> Callable:
    """`compiled` with its tensor outputs cloned as they leave a CUDA graph's memory pool (sjd.models.causal_lm's
    KeptOutputs does the same for the window forward): a decoder keeps p, drafts and accepted lengths past the
    next call, which would overwrite them in place."""

    @functools.wraps(compiled)
    def kept(*args):
        return torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, compiled(*args))

    return kept
