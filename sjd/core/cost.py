"""What one forward costs a GPU: bytes read, FLOPs and kernel launches of a decoder-only transformer, and a
roofline time from a GPU's datasheet. Pure arithmetic, no torch model: a decode's counts (forwards, their widths
and contexts, drafter forwards, host syncs) priced as the real architecture a run stands for.

    time = max(bytes / bandwidth, FLOPs / peak) + launches * launch_s

Bytes are the weights a forward reads once (every layer, and the LM head's rows the pipeline keeps; an embedding
is a gather, not a read of its table) plus the KV cache every row reads at its context. FLOPs are 2 per weight
per token row, plus attention's 4 * context * hidden per token row and layer. Launches are the kernels of the
forward (LAUNCHES_PER_LAYER a layer, eager) or one graph replay (CUDA graphs). The constants a roofline leaves
out (launch and sync costs) are assumptions, named in GPU and meant to be varied.
"""

from __future__ import annotations

from dataclasses import dataclass

BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
LAUNCHES_PER_LAYER = 14  # norms, q/k/v/o, rotary, attention, residuals, gate/up/down and the activation


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
    "chameleon_7b": Architecture("chameleon_7b", 32, 4096, 11008, 32, 32, 65536),
    "llamagen_xl": Architecture("llamagen_xl", 36, 1280, 3584, 20, 20, 16384),
}


def eagle_drafter(target: Architecture, head_rows: int | None = None) -> Architecture:
    """An EAGLE drafter of `target`: its fc (2 hidden -> hidden), one layer of the target's family and the LM
    head (`head_rows`, the target's by default; the image codes when the head is cut)."""
    rows = target.head_rows if head_rows is None else head_rows
    fc_as_rows = 2 * target.hidden  # the fc reads 2 hidden x hidden weights: as many as 2 hidden head rows
    return Architecture(f"eagle({target.name})", 1, target.hidden, target.intermediate, target.heads,
                        target.kv_heads, rows + fc_as_rows)  # fmt: skip


@dataclass(frozen=True)
class GPU:
    """A GPU's datasheet figures and the per-kernel costs a roofline leaves out (assumptions, to be varied)."""

    name: str
    bandwidth: float  # bytes/s, memory
    peak: float  # FLOP/s, dense bf16
    launch_s: float  # host cost of one eager kernel launch
    sync_s: float  # one host read of a device value: the stream drains
    source: str


LAUNCH_S, SYNC_S = 5e-6, 20e-6  # eager launch: several microseconds; a sync: tens of microseconds
GPUS = {
    "H100": GPU("H100 SXM", 3.35e12, 989e12, LAUNCH_S, SYNC_S, "NVIDIA H100 datasheet (SXM5)"),
    "H200": GPU("H200 SXM", 4.8e12, 989e12, LAUNCH_S, SYNC_S, "NVIDIA H200 datasheet"),
    "A100": GPU("A100 80GB SXM", 2.039e12, 312e12, LAUNCH_S, SYNC_S, "NVIDIA A100 datasheet"),
    "RTX3090": GPU("RTX 3090", 936e9, 71e12, LAUNCH_S, SYNC_S, "NVIDIA GeForce RTX 3090 datasheet"),
    "A40": GPU("A40", 696e9, 150e12, LAUNCH_S, SYNC_S, "NVIDIA A40 datasheet"),
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
    arch: Architecture, rows: int, width: int, context: int, dtype: str = "bfloat16", graphed: bool = False
) -> ForwardCost:
    """One forward of `width` tokens on each of `rows` cache rows (batch x CFG) at `context` tokens already in
    the cache: the weights read once, every row's KV read, 2 FLOPs a weight a token row plus attention's."""
    tokens = rows * width
    attention_flops = 4 * arch.layers * arch.hidden * tokens * (context + width)
    return ForwardCost(
        weight_bytes=arch.parameters * BYTES[dtype],
        kv_bytes=rows * (context + width) * arch.kv_bytes_per_token(dtype),
        flops=2 * arch.parameters * tokens + attention_flops,
        launches=1 if graphed else arch.layers * LAUNCHES_PER_LAYER + 2,
    )


def forward_seconds(cost: ForwardCost, gpu: GPU) -> float:
    """The roofline time of one forward plus its launches."""
    return max(cost.bytes / gpu.bandwidth, cost.flops / gpu.peak) + cost.launches * gpu.launch_s


def byte_ratio(drafter: Architecture, target: Architecture) -> float:
    """A drafter forward's weight bytes over the target's: the price of one drafter forward in target forwards
    while both are bound by their weights."""
    return drafter.parameters / target.parameters


def drafter_price(prices_as: str | None) -> float:
    """An EAGLE drafter forward's price in target forwards for the architecture `prices_as` names (the drafters
    compute the full LM head); NaN for None. An unknown name is refused, naming the key."""
    if prices_as is None:
        return float("nan")
    if prices_as not in ARCHITECTURES:
        raise ValueError(f"model.prices_as={prices_as!r}: not one of {sorted(ARCHITECTURES)} (sjd/core/cost.py)")
    arch = ARCHITECTURES[prices_as]
    return byte_ratio(eagle_drafter(arch), arch)


def priced_forwards(target_forwards, drafter_forwards, price: float):
    """Target forwards plus drafter forwards at `price` target forwards each (pandas Series); no drafter forwards
    (0 or NaN) cost nothing, whatever the price."""
    drafted = drafter_forwards.fillna(0.0)
    return target_forwards + drafted.where(drafted == 0, drafted * price)
