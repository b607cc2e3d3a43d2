"""Data-parallel runs under torchrun: which rank this process is, its device, its prompts, and the waits.

`torchrun --nproc_per_node=N run.py ...` starts N copies of run.py with RANK, WORLD_SIZE and
LOCAL_RANK set. Every rank decodes its share of the prompts into its own samples.rank{r}.jsonl in
the one run directory that rank 0 chose; rank 0 merges the shards and writes everything else
(sjd/harness/runner.py). A one-process run (no WORLD_SIZE, or WORLD_SIZE=1) never starts a process group.

The process group is gloo on the CPU and nccl on GPUs (rank r on cuda:LOCAL_RANK). The runner's
own coordination (broadcasting the run directory and the finished samples, the barrier before
the merge) always goes through a gloo group, whose barrier fails after `timeout` naming what it
waited for, so a rank that dies or hangs unnoticed cannot keep the others waiting forever. Under
torchrun a rank that raises also exits non-zero, and torchrun then stops the other ranks at once;
`report_failure` puts the rank's error message into torchrun's failure report.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch

from sjd.harness.ranks import RankInfo

log = logging.getLogger(__name__)
T = TypeVar("T")


def shard(items: Sequence[T], info: RankInfo) -> list[T]:
    """Round-robin by index: rank r takes items r, r + N, r + 2N, ... (N = world size)."""
    return list(items[info.rank :: info.world_size])


def rank_device(device: str, info: RankInfo) -> str:
    """The device of this rank: cuda:LOCAL_RANK on GPUs (one GPU per rank), else `device` as given."""
    if not info.distributed or not device.startswith("cuda"):
        return device
    available = torch.cuda.device_count()
    if info.local_rank >= available:
        raise ValueError(
            f"rank {info.rank} has LOCAL_RANK={info.local_rank} but only {available} GPU(s) are visible: "
            "--nproc_per_node must not exceed the GPUs per node (config key device)"
        )
    return f"cuda:{info.local_rank}"


class DataParallel:
    """The ranks of one run. For a single process every method is a no-op (or the identity)."""

    def __init__(
        self, info: RankInfo, device: str, control_group: Any = None, timeout: timedelta | None = None
    ) -> None:
        self.info, self.device, self._control, self._timeout = info, device, control_group, timeout

    @classmethod
    def start(cls, info: RankInfo, device: str, timeout: timedelta) -> DataParallel:
        """Join the process group (torchrun's MASTER_ADDR/MASTER_PORT); `device` is the run's
        device before it is given a rank (cpu or cuda)."""
        device = rank_device(device, info)
        if not info.distributed:
            return cls(info, device)
        import torch.distributed as dist

        ranks = {"rank": info.rank, "world_size": info.world_size}  # the address comes from MASTER_ADDR/PORT
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", timeout=timeout, device_id=torch.device(device), **ranks)
            # Coordination passes Python objects and needs a barrier with a timeout: gloo has both.
            control = dist.new_group(backend="gloo", timeout=timeout)
        else:
            dist.init_process_group("gloo", timeout=timeout, **ranks)
            control = dist.group.WORLD
        log.info("rank %d of %d on %s", info.rank, info.world_size, device)
        return cls(info, device, control, timeout)

    def barrier(self, what: str) -> None:
        """Wait until every rank got here; fail after the group's timeout, naming the missing ranks."""
        if not self.info.distributed:
            return
        import torch.distributed as dist

        try:
            # The timeout is passed again: monitored_barrier ignores the group's and waits 30 minutes.
            dist.monitored_barrier(group=self._control, timeout=self._timeout, wait_all_ranks=True)
        except RuntimeError as e:
            raise RuntimeError(
                f"rank {self.info.rank} of {self.info.world_size} gave up waiting for the other ranks ({what}): {e}. "
                "Another rank failed or hangs (its own log says why); if ranks legitimately finish far apart, "
                "raise dist_timeout_min."
            ) from e

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank (picklable objects only)."""
        if not self.info.distributed:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._control)
        return box[0]

    def adopt_run_dir(self, own: Path) -> Path:
        """Rank 0's run directory, on every rank. The launcher (Hydra) made a directory for each
        process before any rank was known; another rank's own one is removed when it is still empty."""
        shared = Path(self.broadcast(str(own)))
        if shared.resolve() != own.resolve() and own.is_dir() and not any(own.iterdir()):
            own.rmdir()
        return shared

    def report_failure(self, error: BaseException) -> None:
        """Call inside the `except` block: names the rank in the log and hands the message to torchrun's
        failure report (its TORCHELASTIC_ERROR_FILE), which then stops the other ranks."""
        if not self.info.distributed:
            return
        log.error("rank %d of %d failed: %s: %s", self.info.rank, self.info.world_size, type(error).__name__, error)
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(error)

    def close(self) -> None:
        if not self.info.distributed:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
