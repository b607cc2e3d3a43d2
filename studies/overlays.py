"""Study blocks: what each overlay in conf/experiment/ with a `study:` block puts on its results page."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

FIGURES = {  # figure -> the columns its rows need
    "window": ("step_compression", "latency_speedup"),
    "quality": ("latency_speedup", "fid", "clip"),
    "pareto": ("latency_speedup", "audit_tv", "fid", "lossless_expected"),
    "accept_hist": ("accept_hist", "mean_accepted"),
    "regime": ("step_compression", "entropy_nats"),
    "calibration": ("step_compression", "entropy_nats"),  # a table, not a figure (calibration_page.py)
    "goal": ("step_compression", "vs_sjd_official"),  # a table, not a figure (goal_page.py)
    "drafters": ("step_compression", "vs_sjd_official"),  # a table, not a figure (drafters_page.py)
}


@dataclass
class Study:
    experiment: str
    title: str
    question: str
    commands: list[str]
    figure: str | None


def load_studies(conf_dir: Path) -> dict[str, list[Study]]:
    """page -> the studies (overlays) writing to it, in file-name order. Checks each study block."""
    pages: dict[str, list[Study]] = {}
    for path in sorted(conf_dir.glob("*.yaml")):
        overlay = OmegaConf.load(path)
        block = overlay.get("study")
        if block is None:
            continue
        where = f"{path}: study"
        for key in ("page", "title", "question", "commands"):
            if not block.get(key):
                raise ValueError(f"{where}.{key} is missing (experiments/README.md, 'Writing a study')")
        expected_csv = f"results/studies/{block.page}.csv"
        if overlay.get("results_csv") != expected_csv:
            raise ValueError(f"{path}: results_csv must be {expected_csv} for study.page {block.page!r}")
        figure = block.get("figure")
        if figure is not None and figure not in FIGURES:
            raise ValueError(f"{where}.figure must be one of {sorted(FIGURES)} or null, got {figure!r}")
        study = Study(overlay.get("experiment_name", path.stem), block.title, " ".join(block.question.split()),
                      list(block.commands), figure)  # fmt: skip
        pages.setdefault(block.page, []).append(study)
    return pages
