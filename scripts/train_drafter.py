"""Train an EAGLE drafter for a model with the `features` capability, and check one against its record.

    python scripts/train_drafter.py model=NAME [key=value ...]     # conf/train_drafter.yaml; writes `out`
    python scripts/train_drafter.py --check-recipe DIR              # a drafter against its record, in seconds
    python scripts/train_drafter.py --check-retrain DIR             # retrain it in full, compare bit for bit
    python scripts/train_drafter.py --measure DIR                   # its acceptance again, into its record

Training (sjd.drafters.recipe says what the record holds):
1. captions from the model's own caption space, never its evaluation prompts (`data.captions`, `data.held_out`):
   the toy's scene generator, the stand-ins' procedural themes, or a prompt file for a real model;
2. the model's own AR samples of them at its sampling settings, sample k from the per-prompt generator of
   (data.seed, "drafter-train-k"), and one teacher-forced pass each for the features (sjd.drafters.data),
   cached under `data.cache` by a hash of everything that makes them, a part at a time;
3. EAGLE's training (sjd.drafters.training), with a resumable state in `out` every `checkpoint_every` steps;
4. the probe: the recipe's first `probe.steps` steps on its first `probe.images` images, sampled afresh and
   kept (probe_samples.safetensors, so another CPU checks from the same draws), and the fingerprint of the
   weights they give (sjd.standin.training.tensors_fingerprint);
5. `out`: config.json and model.safetensors in the released layout, drafter.json with the record.

On a GPU the same command trains a real model's drafter (device=auto), given `data.captions=<prompt file>`.
Rerunning a finished command with an unchanged recipe does nothing; a killed one resumes where its last state
was written and ends with the weights an uninterrupted run gives. The work is done by sjd.training.drafter and
sjd.training.drafter_checks.
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from sjd.training.drafter import build
from sjd.training.drafter_checks import main_check


def main() -> None:
    if any(arg.startswith(("--check", "--measure", "--record")) for arg in sys.argv[1:]):
        sys.exit(main_check(sys.argv[1:], __doc__))
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from sjd.harness.config import register_resolvers

    register_resolvers()

    @hydra.main(version_base="1.3", config_path="../conf", config_name="train_drafter")
    def run(cfg: DictConfig) -> None:
        overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith(("hydra.", "hydra/"))]
        build(cfg, overrides)

    run()


if __name__ == "__main__":
    main()
