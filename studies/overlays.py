"""Study blocks: what each overlay in conf/experiment/ with a `study:` block puts on its results page."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

FIGURES = {  # figure -> the columns its rows need
    "window": ("step_compression", "latency_speedup"),
    "quality": ("latency_speedup", "fid", "clip"),
    "pareto": ("latency_speedup", "audit_tv", "fid", "lossless_expected"),
    "accept_hist": ("accept_hist", "mean_accepted"),
    "frontier": ("step_compression", "tf_excess_nats"),  # excess nats a token against modelled speed (else steps)
    "readings": ("step_compression", "tf_excess_nats"),  # a frontier, then the readings' table (readings_page.py)
    "regime": ("step_compression", "entropy_nats"),
    "calibration": ("step_compression", "entropy_nats"),  # a table, not a figure (calibration_page.py)
    "goal": ("step_compression", "vs_sjd_official"),  # a table, not a figure (goal_page.py)
    "drafters": ("step_compression", "vs_sjd_official"),  # a table, not a figure (drafters_page.py)
    "cost": ("step_compression", "modelled_eager_efficiency"),  # a table, not a figure (cost_page.py)
}


@dataclass(frozen=True)
class Goal:
    """What a goal page decides, from its overlay's `study.goal` block: at each window, the reference decoder a
    candidate's step compression (shown) and latency (decisive) are divided by, and the target its latency ratio
    must reach (none: the page shows the ratio and decides nothing there); `faster_of` names, by window, further
    references the target is read against, the faster of them all (studies.latency_verdict). A drafters page also
    names the decoders it reads against a published ratio (`checked`), those among them whose drafter was trained
    to land on that ratio (`calibrated`: a fit, whose test is then its modelled latency speedup against the
    published one), and the experiment whose runs confirm a met on fresh prompts and seeds (`confirming`)."""

    references: dict[int, str]
    targets: dict[int, float]
    checked: tuple[str, ...] = ()
    confirming: str | None = None
    calibrated: tuple[str, ...] = ()
    faster_of: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def reference(self, window: int) -> str:
        return self.references[window]

    def latency_references(self, window: int) -> tuple[str, ...]:
        """The decoders a latency target at `window` is read against: its reference and the `faster_of` ones."""
        return (self.references[window], *self.faster_of.get(window, ()))


@dataclass
class Study:
    experiment: str
    title: str
    question: str
    commands: list[str]
    figure: str | None
    goal: Goal | None = None


GOAL_FIGURES = ("goal", "drafters")  # the pages that decide targets: their studies carry `study.goal`


def read_goal(block, where: str) -> Goal:
    """`study.goal` of an overlay: references and targets by window, each target's window with a reference."""
    goal = OmegaConf.to_container(block) if block is not None else None
    if not isinstance(goal, dict) or not goal.get("references"):
        raise ValueError(f"{where}.goal must name its references by window (experiments/README.md)")
    references = {int(w): str(d) for w, d in goal["references"].items()}
    targets = {int(w): float(t) for w, t in (goal.get("targets") or {}).items()}
    if set(targets) - set(references):
        raise ValueError(f"{where}.goal.targets at windows {sorted(set(targets) - set(references))} have no reference")
    checked, calibrated = tuple(goal.get("checked") or ()), tuple(goal.get("calibrated") or ())
    if set(calibrated) - set(checked):
        raise ValueError(f"{where}.goal.calibrated names {sorted(set(calibrated) - set(checked))}, not in checked")
    faster_of = {int(w): tuple(str(d) for d in (v if isinstance(v, list) else [v]))
                 for w, v in (goal.get("faster_of") or {}).items()}  # fmt: skip
    if set(faster_of) - set(references):
        unknown = sorted(set(faster_of) - set(references))
        raise ValueError(f"{where}.goal.faster_of at windows {unknown} has no reference")
    return Goal(references, targets, checked, goal.get("confirming"), calibrated, faster_of)


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
        goal = read_goal(block.get("goal"), where) if figure in GOAL_FIGURES else None
        study = Study(overlay.get("experiment_name", path.stem), block.title, " ".join(block.question.split()),
                      list(block.commands), figure, goal)  # fmt: skip
        pages.setdefault(block.page, []).append(study)
    return pages
