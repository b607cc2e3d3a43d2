"""What one forward costs a GPU: bytes read, FLOPs and kernel launches of a decoder-only transformer, and a
roofline time from a GPU's datasheet. Pure arithmetic, no torch model: a decode's counts (forwards, their widths
and contexts, drafter forwards, host syncs) priced as the real architecture a run stands for.

    time = max(bytes / (bandwidth * reached), FLOPs / (peak * reached)) + launches * launch_s

Bytes are the weights a forward reads once (every layer, and the LM head's rows the pipeline keeps; an embedding
is a gather, not a read of its table) plus the KV cache every row reads at its context. FLOPs are 2 per weight
per token row, plus attention's 4 * context * hidden per token row and layer. Launches are the operator calls of
the forward (FORWARD_OPS_FIXED + FORWARD_OPS_PER_LAYER a layer, eager) or one graph replay (CUDA graphs).

A whole decode (`decode_seconds`) adds its drafter forwards and the decoder's own operator calls and host syncs
outside the forwards. What each costs depends on the engine (ENGINES): `eager` is PyTorch eager as the published
code and our adapters run it, a host time per operator call (EAGER_OP_S); `compiled` is compile=true as our GPU
run measured it (compiled kernels, no CUDA graphs), a host time per forward as a whole (COMPILED_FORWARD_S);
`graphed` replays each forward as one CUDA graph and pays the decoder's own calls at a launch cost (LAUNCH_S), an
assumption no GPU run of ours has measured.

The datasheet figures (GPUS) are facts; what a run reaches of them is not. The constants fitted on our own GPU
timings (EAGER_OP_S, PEAK_REACHED, COMPILED_FORWARD_S) come from `fit_constants` in sjd/core/cost_fit.py over
results/gpu_forward_latency.csv, which tests/studies/test_cost_fit.py recomputes. The others are assumptions, each
with the range a verdict must hold over (RANGES, `corners`): the bandwidth reached, the launch and sync costs, and
the eager call's cost between what each fitted timing alone implies.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Operator calls of one forward of transformers' Chameleon (Lumina-mGPT's and Anole's) after the prefill, counted
# as the sync counter counts a decoder's (calls that make a device tensor): `python scripts/count_syncs.py
# --forward-ops`, and tests/core/test_cost.py holds these to that count.
FORWARD_OPS_PER_LAYER = 65
FORWARD_OPS_FIXED = 25  # outside the layers: the cache's bookkeeping, embedding, final norm, head


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer's shape: what its forwards read."""

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_rows: int  # rows of the LM head the forward computes (the vocabulary, or the image codes kept)
    code_rows: int = 0  # of them, the image codes' (what a drafter's `head: codes` computes); 0: all of them

    @property
    def layer_parameters(self) -> int:
        head_dim = self.hidden // self.heads
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head_dim
        return attention + 3 * self.hidden * self.intermediate

    @property
    def parameters(self) -> int:
        """Parameters a forward reads: every layer and the LM head's rows (not the embedding table)."""
        return self.layers * self.layer_parameters + self.head_rows * self.hidden

    def kv_bytes_per_token(self, dtype: str) -> int:
        return 2 * self.layers * self.kv_heads * (self.hidden // self.heads) * BYTES[dtype]


# The real architectures the calibrated stand-ins stand for, from their released configurations.
ARCHITECTURES = {
    # Lumina-mGPT 7B and Anole 7B are Chameleon-7B: its head has 65,536 rows, of which 8,192 are image codes.
    "chameleon_7b": Architecture("chameleon_7b", 32, 4096, 11008, 32, 32, 65536, code_rows=8192),
    "llamagen_xl": Architecture("llamagen_xl", 36, 1280, 3584, 20, 20, 16384),  # its head is all codes
}


def draft_head_rows(target: Architecture, head: str) -> int:
    """The LM head rows a drafter or draft heads compute: the target's every row (`full`) or its image codes'
    (`codes`, sjd.drafters.checkpoint.DRAFT_HEADS)."""
    if head not in ("full", "codes"):
        raise ValueError(f"a draft head is full or codes, got {head!r}")
    return (target.code_rows or target.head_rows) if head == "codes" else target.head_rows


def eagle_drafter(target: Architecture, head_rows: int | None = None) -> Architecture:
    """An EAGLE drafter of `target`: its fc (2 hidden -> hidden), one layer of the target's family and the LM
    head (`head_rows`, the target's by default; the image codes when the head is cut)."""
    rows = target.head_rows if head_rows is None else head_rows
    fc_as_rows = 2 * target.hidden  # the fc reads 2 hidden x hidden weights: as many as 2 hidden head rows
    return Architecture(f"eagle({target.name})", 1, target.hidden, target.intermediate, target.heads,
                        target.kv_heads, rows + fc_as_rows)  # fmt: skip


def draft_heads(target: Architecture, heads: int, head_rows: int | None = None) -> Architecture:
    """`heads` parallel draft heads of `target` (sjd.drafters.heads): each a residual block of two hidden x hidden
    matrices on the target's last feature, then the target's LM head once over all of them (`head_rows`, the
    target's by default). No layer, so no KV cache: a heads call reads its weights once, whatever it drafts."""
    rows = target.head_rows if head_rows is None else head_rows
    blocks_as_rows = heads * 2 * target.hidden  # each block reads 2 hidden x hidden weights
    return Architecture(f"heads{heads}({target.name})", 0, target.hidden, target.intermediate, target.heads,
                        target.kv_heads, rows + blocks_as_rows)  # fmt: skip


# The share of the datasheet's bf16 peak a forward's matmuls reach at these shapes (a window of 64 at batch 1 with
# CFG multiplies 128 token rows): fitted on the H200's forwards over windows 1 to 64 (sjd/core/cost_fit.py). The
# datasheet peak alone priced an eager window-64 forward 0.4% above window 1 where the measured one grew 6 to 17%.
PEAK_REACHED = 0.39


@dataclass(frozen=True)
class GPU:
    """A GPU's datasheet figures, what a forward reaches of them, and the cost of a host sync on it."""

    name: str
    bandwidth: float  # bytes/s, memory (datasheet)
    peak: float  # FLOP/s, dense bf16 (datasheet)
    sync_s: float  # one host read of a device value: the stream drains (an assumption, SYNC_S_RANGE)
    source: str
    bandwidth_reached: float = 1.0  # share of the datasheet bandwidth a forward's reads reach (BANDWIDTH_REACHED)
    peak_reached: float = PEAK_REACHED  # share of the datasheet peak its matmuls reach (fitted)


SYNC_S = 20e-6  # a sync: tens of microseconds
GPUS = {
    "H100": GPU("H100 SXM", 3.35e12, 989e12, SYNC_S, "NVIDIA H100 datasheet (SXM5)"),
    "H200": GPU("H200 SXM", 4.8e12, 989e12, SYNC_S, "NVIDIA H200 datasheet"),
    "A100": GPU("A100 80GB SXM", 2.039e12, 312e12, SYNC_S, "NVIDIA A100 datasheet"),
    "RTX4090": GPU("RTX 4090", 1.008e12, 165e12, SYNC_S, "NVIDIA Ada GPU architecture whitepaper (fp32 accumulate)"),
    "RTX3090": GPU("RTX 3090", 936e9, 71e12, SYNC_S, "NVIDIA GeForce RTX 3090 datasheet"),
    "A40": GPU("A40", 696e9, 150e12, SYNC_S, "NVIDIA A40 datasheet"),
}
DEFAULT_GPU = "H100"


@dataclass(frozen=True)
class ForwardCost:
    weight_bytes: float
    kv_bytes: float
    flops: float
    launches: int

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes


def forward_cost(
    arch: Architecture, rows: int, width: int, context: float, dtype: str = "bfloat16", graphed: bool = False
) -> ForwardCost:
    """One forward of `width` tokens on each of `rows` cache rows (batch x CFG) at `context` tokens already in
    the cache: the weights read once, every row's KV read, 2 FLOPs a weight a token row plus attention's."""
    tokens = rows * width
    attention_flops = 4 * arch.layers * arch.hidden * tokens * (context + width)
    return ForwardCost(
        weight_bytes=arch.parameters * BYTES[dtype],
        kv_bytes=rows * (context + width) * arch.kv_bytes_per_token(dtype),
        flops=2 * arch.parameters * tokens + attention_flops,
        launches=1 if graphed else arch.layers * FORWARD_OPS_PER_LAYER + FORWARD_OPS_FIXED,
    )


def roofline_seconds(cost: ForwardCost, gpu: GPU) -> float:
    """The time the device needs for one forward: its bytes at the bandwidth it reaches or its FLOPs at the peak
    it reaches."""
    return max(cost.bytes / (gpu.bandwidth * gpu.bandwidth_reached), cost.flops / (gpu.peak * gpu.peak_reached))


def forward_seconds(cost: ForwardCost, gpu: GPU, op_s: float) -> float:
    """The roofline time of one forward plus its launches at `op_s` each (the engine's, ENGINES)."""
    return roofline_seconds(cost, gpu) + cost.launches * op_s


@dataclass(frozen=True)
class Engine:
    """How a forward and the decoder's own calls reach the GPU."""

    name: str
    graphed: bool  # a forward is one CUDA graph replay
    op_s: float  # host time of one operator call (a forward's, when not graphed, and the decoder's own)
    source: str
    forward_s: float | None = None  # a forward's host time as a whole, where fitted so (compiled), not per call
    kernels: str = "eager"  # the decoder's calls it pays, as results/syncs.csv counted them: eager or compiled


def engine_forward_seconds(cost: ForwardCost, gpu: GPU, engine: Engine) -> float:
    """One forward on `engine`: its roofline time plus its host time (its calls at `op_s`, one replay when graphed,
    or the engine's fitted time a forward)."""
    if engine.forward_s is not None and not engine.graphed:
        return roofline_seconds(cost, gpu) + engine.forward_s
    return forward_seconds(cost, gpu, engine.op_s)


# Fitted on our own H200 timings of Lumina-mGPT-7B and Anole-7B (results/gpu_forward_latency.csv,
# `scripts/gpu_smoke.sh`) by sjd/core/cost_fit.py: the eager forwards over windows 1 to 64 and the eager AR decodes
# (EAGER_OP_S, PEAK_REACHED), the compiled AR decode (COMPILED_FORWARD_S); the SJD decodes are held out.
# tests/studies/test_cost_fit.py recomputes them from those rows.
EAGER_OP_S = 12.91e-6
COMPILED_FORWARD_S = 9.398e-3
LAUNCH_S = 5e-6  # one kernel launch from a tight host loop: several microseconds
ENGINES = {
    "eager": Engine("eager", False, EAGER_OP_S, "fitted on our H200 eager forwards and AR decodes"),
    "compiled": Engine(
        "compiled",
        False,
        LAUNCH_S,
        "fitted on our H200 compiled AR decode, no CUDA graphs",
        COMPILED_FORWARD_S,
        "compiled",
    ),
    "graphed": Engine("graphed", True, LAUNCH_S, "assumed: each forward one graph replay, decoder calls launched"),
}
DEFAULT_ENGINE = "graphed"

# The plausible range of each constant a verdict must hold over (`corners`): the share of the datasheet bandwidth a
# forward reaches, a launch and a host sync (orders of magnitude: several microseconds, tens of microseconds), and
# an eager call between what the fitted timings imply one by one (EAGER_OP_S_RANGE, sjd/core/cost_fit.py).
BANDWIDTH_REACHED = (0.7, 1.0)
LAUNCH_S_RANGE = (2e-6, 10e-6)
SYNC_S_RANGE = (10e-6, 50e-6)
EAGER_OP_S_RANGE = (11.74e-6, 18.74e-6)


@dataclass(frozen=True)
class Corner:
    """One corner of the constants' plausible range: an engine with its call cost, a GPU with its bandwidth reached
    and its sync cost."""

    engine: Engine
    gpu: GPU

    @property
    def label(self) -> str:
        call = "op" if self.engine.name == "eager" else "launch"
        return (f"{self.engine.name}, bandwidth x{self.gpu.bandwidth_reached:g}, {call} "
                f"{self.engine.op_s * 1e6:.3g} us, sync {self.gpu.sync_s * 1e6:.3g} us")  # fmt: skip


def corners(gpu: GPU, engines: Sequence[str] = tuple(ENGINES)) -> list[Corner]:
    """Every corner of the plausible range on `gpu`, per engine: bandwidth reached x call cost x sync cost (a
    modelled time is affine in each, so a ratio of two is extreme at the corners)."""
    out = []
    for name in engines:
        engine = ENGINES[name]
        calls = EAGER_OP_S_RANGE if name == "eager" else LAUNCH_S_RANGE
        for reached, op_s, sync_s in itertools.product(BANDWIDTH_REACHED, calls, SYNC_S_RANGE):
            out.append(Corner(replace(engine, op_s=op_s), replace(gpu, bandwidth_reached=reached, sync_s=sync_s)))
    return out


@dataclass(frozen=True)
class DecodeCounts:
    """What one image's decode asked of the GPU, as a run records it."""

    forwards: float  # target forwards
    context: float  # tokens in the cache before a target forward, on average over them
    width: float  # tokens a target forward feeds per row, on average
    drafter_forwards: float = 0.0
    decoder_ops: float = 0.0  # operator calls outside the forwards, per target forward
    syncs: float = 0.0  # host syncs per target forward
    head_forwards: float = 0.0  # calls of parallel draft heads (each drafts all its positions at once)
    heads: int = 0  # how many heads a call runs
    draft_head_rows: int | None = None  # LM head rows the heads compute (None: the target's every row)


def mean_context(committed: Sequence[int]) -> float:
    """The mean context of a decode's target forwards, from the tokens each committed (a forward's context is
    what the ones before it committed)."""
    counts = np.asarray(committed, dtype=float)
    return float((np.cumsum(counts) - counts).mean()) if len(counts) else 0.0


def decode_seconds(
    counts: DecodeCounts,
    target: Architecture,
    gpu: GPU,
    engine: Engine,
    rows: int,
    drafter: Architecture | None = None,
    dtype: str = "bfloat16",
) -> float:
    """The modelled time of one image's decode, at batch 1 with `rows` cache rows (2 with CFG): its target
    forwards at their mean width and context, its drafter forwards (width 1) at the same context, and the
    decoder's own calls and syncs per target forward. Pricing every forward at the mean context is exact while
    every forward is bound by bytes (or every one by FLOPs): both grow linearly in the context. The prompt's
    tokens are left out of the contexts."""
    width = max(int(round(counts.width)), 1)
    cost = forward_cost(target, rows, width, counts.context, dtype, engine.graphed)
    target_s = engine_forward_seconds(cost, gpu, engine)
    seconds = counts.forwards * (target_s + counts.decoder_ops * engine.op_s + counts.syncs * gpu.sync_s)
    if counts.drafter_forwards:
        if drafter is None:
            raise ValueError("a decode with drafter forwards needs the drafter's architecture to be priced")
        cost = forward_cost(drafter, rows, 1, counts.context, dtype, engine.graphed)
        seconds += counts.drafter_forwards * forward_seconds(cost, gpu, engine.op_s)
    if counts.head_forwards:
        heads = draft_heads(target, counts.heads, counts.draft_head_rows)
        cost = forward_cost(heads, rows, counts.heads, counts.context, dtype, engine.graphed)
        seconds += counts.head_forwards * forward_seconds(cost, gpu, engine.op_s)
    return seconds


def byte_ratio(drafter: Architecture, target: Architecture) -> float:
    """A drafter forward's weight bytes over the target's: the price of one drafter forward in target forwards
    while both are bound by their weights."""
    return drafter.parameters / target.parameters


def drafter_price(prices_as: str | None, head: str = "full") -> float:
    """An EAGLE drafter forward's price in target forwards for the architecture `prices_as` names, its LM head
    `full` or cut to the image `codes`; NaN for None. An unknown name is refused, naming the key."""
    if prices_as is None:
        return float("nan")
    if prices_as not in ARCHITECTURES:
        raise ValueError(f"model.prices_as={prices_as!r}: not one of {sorted(ARCHITECTURES)} (sjd/core/cost.py)")
    arch = ARCHITECTURES[prices_as]
    return byte_ratio(eagle_drafter(arch, draft_head_rows(arch, head)), arch)


def heads_price(prices_as: str | None, heads: int, head: str = "full") -> float:
    """A call of `heads` parallel draft heads, priced in target forwards for the architecture `prices_as` names,
    their LM head `full` or cut to the image `codes`; NaN for None."""
    if prices_as is None:
        return float("nan")
    drafter_price(prices_as)  # refuses an unknown name
    arch = ARCHITECTURES[prices_as]
    return byte_ratio(draft_heads(arch, heads, draft_head_rows(arch, head)), arch)


def priced_forwards(target_forwards, drafter_forwards, price: float):
    """Target forwards plus drafter forwards at `price` target forwards each (pandas Series); no drafter forwards
    (0 or NaN) cost nothing, whatever the price."""
    drafted = drafter_forwards.fillna(0.0)
    return target_forwards + drafted.where(drafted == 0, drafted * price)
