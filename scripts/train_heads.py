"""Train parallel draft heads for a model with the `features` capability (sjd/drafters/heads.py).

    python scripts/train_heads.py model=NAME [key=value ...]     # conf/train_heads.yaml; writes `out`

The drafter recipe's data (the model's own AR samples and their features, shared with scripts/train_drafter.py
through `data.cache`), the heads' training on all images but the last `measure_images`, their acceptance per head
on those, and `out`: heads.safetensors and heads.json with the record. Rerunning a finished command with an
unchanged recipe does nothing. The work is done by sjd.training.heads.
"""

from __future__ import annotations

from omegaconf import DictConfig

from sjd.training.heads import build


def main() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from sjd.harness.config import register_resolvers

    register_resolvers()

    @hydra.main(version_base="1.3", config_path="../conf", config_name="train_heads")
    def run(cfg: DictConfig) -> None:
        overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith(("hydra.", "hydra/"))]
        build(cfg, overrides)

    run()


if __name__ == "__main__":
    main()
