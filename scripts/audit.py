"""Exactness audit of a decoder: `python scripts/audit.py decoder=NAME [options]`.

Prints, as its last line, one JSON object with decoder, n_samples, tv_distance, p_value,
lossless_expected (and the same numbers for AR as a noise floor), and the one-sample teacher-forced
audit's tf_* numbers (docs/algorithms.md, "Exactness audits"). The driver is sjd.audit.driver, which
the in-run audit shares. A lossless decoder should show p-values that are not small and a TV
distance at AR's noise level.
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig

from sjd.audit.driver import audit_report
from sjd.harness.config import register_resolvers

register_resolvers()


@hydra.main(version_base="1.3", config_path="../conf", config_name="audit")
def main(cfg: DictConfig) -> None:
    print(json.dumps(audit_report(cfg), default=float))


if __name__ == "__main__":
    main()
