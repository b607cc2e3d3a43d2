"""Benchmark decoders on a text-to-image AR model.

python run.py                                   # toy model, SJD vs AR, 8 toy prompts, CPU
python run.py decoder=sjd model=lumina          # a real model (needs its weights)
python run.py --multirun decoder.window=4,8,16  # sweeps
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from sjd.config import register_resolvers
from sjd.runner import run

register_resolvers()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run(cfg, HydraConfig.get().runtime.output_dir)


if __name__ == "__main__":
    main()
