"""Which rank this process is under torchrun, read from the variables torchrun sets. Apart from the data-parallel
machinery (sjd/harness/distributed.py) because run.py asks before anything heavy is imported: it needs no torch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def rank_info(environ: Mapping[str, str] = os.environ) -> RankInfo:
    """This process's rank, from the variables torchrun sets; one process when WORLD_SIZE is unset."""
    if "WORLD_SIZE" not in environ:
        return RankInfo()
    try:
        world_size = int(environ["WORLD_SIZE"])
        rank = int(environ["RANK"])
        local_rank = int(environ.get("LOCAL_RANK", rank))
    except KeyError as e:
        raise ValueError(f"WORLD_SIZE is set but {e.args[0]} is not: start data-parallel runs with torchrun") from None
    except ValueError as e:
        raise ValueError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers ({e})") from None
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        raise ValueError(f"RANK={rank}, LOCAL_RANK={local_rank}, WORLD_SIZE={world_size} do not describe a rank")
    return RankInfo(rank, world_size, local_rank)
