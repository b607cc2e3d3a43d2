"""What a device can do, measured: its identity and clocks, the bandwidth a large copy reaches, the time of the
matrix-vector products a decode step is made of, and attention alone over a static cache's slots.

The first two stages of the device check (sjd.bench.gpu_check). On a GPU every time is from CUDA events around
repeated calls after a warm-up (the median); on the CPU from the wall clock, which makes the same code runnable in
a test at tiny shapes. Shapes come from a real architecture's config (`LayerShapes.of`), so the figures are those
of the model the check times, not of a generic benchmark.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sjd.core.cost import BYTES, GPUS


@dataclass(frozen=True)
class LayerShapes:
    """The linear layers of one decoder layer and the head rows decoding needs, as (in, out) features."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    code_rows: int

    @classmethod
    def of(cls, config, code_rows: int) -> LayerShapes:
        """From a transformers config (its text config where it is a composite one) and the image codes' rows."""
        config = getattr(config, "text_config", None) or config
        return cls(
            config.hidden_size, config.intermediate_size, config.num_attention_heads,
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads, code_rows,
        )  # fmt: skip

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linears(self) -> dict[str, tuple[int, int]]:
        kv = self.kv_heads * self.head_dim
        return {
            "q": (self.hidden, self.hidden), "k": (self.hidden, kv), "v": (self.hidden, kv),
            "o": (self.hidden, self.hidden),
            "gate": (self.hidden, self.intermediate), "up": (self.hidden, self.intermediate),
            "down": (self.intermediate, self.hidden), "code_head": (self.hidden, self.code_rows),
        }  # fmt: skip


def timed_ms(device: torch.device, fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median milliseconds of `fn()` over `repeats` calls after `warmup`: CUDA events on a GPU (the device's own
    time, the host queueing ahead), the wall clock elsewhere."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def datasheet(device: torch.device) -> dict | None:
    """The datasheet entry (sjd.core.cost.GPUS) whose key the device's name contains, if any."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).replace(" ", "")
    for key, gpu in GPUS.items():
        if key in name:
            return {"key": key, "bandwidth_gbs": gpu.bandwidth / 1e9, "peak_tflops": gpu.peak / 1e12}
    return None


def clocks() -> dict | None:
    """SM and memory clocks, power limit and temperature from nvidia-smi (None without it)."""
    if shutil.which("nvidia-smi") is None:
        return None
    query = "name,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,temperature.gpu,driver_version"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=15
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    return dict(zip(query.split(","), (v.strip() for v in out.splitlines()[0].split(",")))) if out else None


def describe(device: torch.device) -> dict:
    """The device, its memory and compute units, the software, and what its datasheet says."""
    info = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                 "sm_count": props.multi_processor_count, "capability": f"{props.major}.{props.minor}"}  # fmt: skip
    else:
        info |= {"name": "cpu", "threads": torch.get_num_threads()}
    return info | {"datasheet": datasheet(device), "clocks": clocks()}


def copy_bandwidth(device: torch.device, mib: int, repeats: int) -> dict:
    """GB/s a device-to-device copy of `mib` MiB reaches (it reads and writes every byte)."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timed_ms(device, lambda: dst.copy_(src), repeats)
    return {"copy_mib": mib, "copy_ms": round(ms, 4), "bandwidth_gbs": round(2 * src.numel() / ms / 1e6, 1)}


def matvec_times(
    device: torch.device, dtype: torch.dtype, shapes: LayerShapes, rows: list[int], repeats: int
) -> list[dict]:
    """Each linear of a layer (and the code head) at each row count: ms and the weight bytes it read per ms."""
    out = []
    for name, (n_in, n_out) in shapes.linears().items():
        weight = torch.randn(n_out, n_in, dtype=dtype, device=device) * n_in**-0.5
        for r in rows:
            x = torch.randn(r, n_in, dtype=dtype, device=device)
            ms = timed_ms(device, lambda x=x, weight=weight: torch.nn.functional.linear(x, weight), repeats)
            gbs = weight.numel() * weight.element_size() / ms / 1e6
            out.append({"linear": name, "in": n_in, "out": n_out, "rows": r, "ms": round(ms, 4), "gbs": round(gbs, 1)})
        del weight
    return out


def attention_times(
    device: torch.device,
    dtype: torch.dtype,
    shapes: LayerShapes,
    slots: int,
    contexts: list[int],
    windows: list[int],
    repeats: int,
    rows: int = 2,
) -> list[dict]:
    """One layer's attention at `rows` cache rows (a prompt and its CFG row): over all `slots` of a static cache
    with a mask that hides the slots past the live prefix (what the static cache does), against over the live
    prefix alone (what a length bucket or a block mask would read). ms each, and the KV bytes the live prefix
    holds per ms."""
    out = []
    gqa = shapes.heads != shapes.kv_heads  # grouped-query attention: several query heads share a KV head
    for context in contexts:
        for w in windows:
            live = min(context + w, slots)
            q = torch.randn(rows, shapes.heads, w, shapes.head_dim, dtype=dtype, device=device)
            k = torch.randn(rows, shapes.kv_heads, slots, shapes.head_dim, dtype=dtype, device=device)
            v = torch.randn_like(k)
            mask = torch.zeros(rows, 1, w, slots, dtype=torch.bool, device=device)
            mask[..., : live - w] = True
            mask[..., live - w : live] = torch.ones(w, w, dtype=torch.bool, device=device).tril()

            def full(q=q, k=k, v=v, mask=mask):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, mask, enable_gqa=gqa)

            def prefix(q=q, k=k, v=v, mask=mask, live=live):
                m = mask[..., :live]
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k[:, :, :live], v[:, :, :live], m, enable_gqa=gqa
                )

            all_ms, live_ms = timed_ms(device, full, repeats), timed_ms(device, prefix, repeats)
            kv = 2 * rows * shapes.kv_heads * live * shapes.head_dim * BYTES[str(dtype).removeprefix("torch.")]
            out.append({"context": context, "window": w, "slots": slots, "all_slots_ms": round(all_ms, 4),
                        "live_prefix_ms": round(live_ms, 4), "all_over_live": round(all_ms / live_ms, 2),
                        "live_kv_gbs": round(kv / live_ms / 1e6, 1)})  # fmt: skip
    return out
