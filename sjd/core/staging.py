"""Host values onto the device without making the host wait.

A decoder's loop keeps some bookkeeping on the host (each row's committed length, its window width), and every
forward needs it on the device (positions, write slots, masks). Copying a Python list to a GPU the usual way,
`torch.tensor(values, device="cuda")`, copies from pageable host memory: the host blocks until the stream has
reached the copy, a sync that drains the queue of kernels the host had run ahead with. `device_ints` copies from
pinned (page-locked) memory without blocking instead; torch's pinned-memory allocator keeps the buffer until the
copy has run, so the values can be dropped at once. Elsewhere it is a plain tensor.

`sjd.bench.syncs` counts a non-blocking copy as no sync and every other copy of host data as one; this is the one
place the package asks for a non-blocking copy (a test holds it), so that count is honest.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def device_ints(values: Sequence[int], device: torch.device | str, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """`values` as a [len(values)] tensor of `dtype` on `device`, copied without a host sync."""
    device = torch.device(device)
    staged = torch.tensor(list(values), dtype=dtype, pin_memory=device.type == "cuda")
    return staged.to(device, non_blocking=True)


def to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor (built on the host, e.g. a window's layout) on `device`, copied without a host sync."""
    device = torch.device(device)
    staged = host.pin_memory() if device.type == "cuda" and host.device.type == "cpu" else host
    return staged.to(device, non_blocking=True)
