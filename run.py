"""Benchmark decoders on a text-to-image AR model.

python run.py                                   # toy model, SJD vs AR, 8 toy prompts, CPU
python run.py decoder=sjd model=lumina          # a real model (needs its weights)
python run.py --multirun decoder.window=4,8,16  # sweeps
torchrun --nproc_per_node=4 run.py model=emu3   # data-parallel: prompts dealt to 4 ranks (one GPU each),
                                                # the same samples as one process; rank 0 writes the summary
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from sjd.harness.config import register_resolvers
from sjd.harness.ranks import rank_info

register_resolvers()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    if rank_info().distributed and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise ValueError("--multirun under torchrun is not supported: run one torchrun job per sweep point")
    # Imported once Hydra has composed the config: a mistyped group or key fails in a second, not after torch
    from sjd.harness.runner import run

    run(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    if rank_info().rank > 0:
        # Every rank works in rank 0's run directory (sjd.harness.runner.run); Hydra's own folder for this
        # rank stays empty (no .hydra/ copy, log to stdout) and is removed.
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    main()
