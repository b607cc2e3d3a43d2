"""Render the results pages docs/results/<page>.md from the study CSVs results/studies/<page>.csv.

A study is an overlay in conf/experiment/ with a `study:` block (experiments/README.md): its page,
title, question, the commands whose rows the page shows, and optionally a figure. For every study
CSV present, the page has one section per overlay writing to it, and under it one part per listed
command: the command, the git hash(es), config fingerprint(s) and settings of the rows of its latest
run, a table of the key columns, and the figure. A row whose recorded command no study lists is an
error: the page shows only numbers a named command gives. Also writes docs/results/README.md, the
index of the pages, and the headline table of README.md (between its `<!-- headline:begin -->` and
`<!-- headline:end -->` markers): the part of one study page named by HEADLINE. Figures
(`study.figure`): window (step compression and speedup against the window), quality (FID and CLIP
against speedup), pareto (speedup against audit distance and FID), frontier (modelled speedup against the
one-sample audit's excess nats a token, studies.frontier), readings (a frontier, then the table of a run's SSD
readings, the one nearest the published figure and where their impossible tokens fall, studies.readings_page),
accept_hist (tokens committed per forward, one panel per decoder). Five study kinds close their page with one
section for all their commands instead: `regime` (studies.regime_page), `calibration` (the published-ratio
anchors of each stand-in tried, studies.calibration_page), `goal` (the lossless
candidates against official SJD and SJD-PAC, studies.goal_page), `drafters` (the
trained-drafter decoders, studies.drafters_page) and `cost` (the cost model against the published latencies,
studies.cost_page).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from sjd.harness import plots
from studies import figures
from studies.calibration_page import calibration_section
from studies.cost_page import cost_section
from studies.drafters_page import drafters_section
from studies.engine_page import render_engine_page
from studies.frontier import frontier, powered_lines, published_lines
from studies.goal_page import POWERED_PAGE, goal_section
from studies.gpu_check_page import TITLE as GPU_CHECK_TITLE
from studies.gpu_check_page import render_gpu_check_page
from studies.gpu_page import TITLE as GPU_TITLE
from studies.gpu_page import render_gpu_page
from studies.heads_acceptance import heads_acceptance_lines, shipped_heads_lines
from studies.overlays import FIGURES, Goal, Study, load_studies
from studies.readings_page import readings_lines
from studies.real_size_page import TITLE as REAL_SIZE_TITLE
from studies.real_size_page import render_real_size_page
from studies.regime_page import PUBLISHED, regime_section
from studies.tables import INTERVAL_LEGEND, describe_run, key_table, latest_run, markdown

CHECKOUT = Path(__file__).resolve().parents[1]  # the shipped assets a page lists are this checkout's

GENERATOR = "python scripts/results_pages.py"
# Pages of the benchmark tools (scripts/bench_engine.py, scripts/real_size.py, scripts/gpu_smoke.sh,
# scripts/gpu_check.py): each renders from its file in results/ when it is there, and its index line says what it
# shows.
TOOL_PAGES = (
    (render_engine_page, "the engine: eager against compiled, dynamic against static cache"),
    (render_real_size_page, REAL_SIZE_TITLE),
    (render_gpu_page, GPU_TITLE),
    (render_gpu_check_page, GPU_CHECK_TITLE),
)
FRONTIERS = ("frontier", "readings")  # the figures drawn as a frontier (studies.frontier)
SECTION_KINDS = ("regime", "calibration", "goal", "drafters", "cost")  # studies that close their page with one section
# README's headline: (page, command) of the study part it shows.
HEADLINE = ("toy_schedule", "python run.py experiment=toy_schedule decoder.window=16")
HEADLINE_MARKERS = ("<!-- headline:begin -->", "<!-- headline:end -->")


def draw(figure: str, rows: pd.DataFrame, out: Path) -> Path:
    """One of FIGURES for the rows of one run."""
    configs = json.loads(rows["decoder_configs"].iloc[0])
    baseline = rows["baseline"].iloc[0] if "baseline" in rows else None
    others = rows[rows["decoder"] != baseline]
    if figure == "window":
        table = others.assign(window=[configs[d]["window"] for d in others["decoder"]])
        return figures.window_sweep(table, out)
    if figure == "quality":
        return figures.quality_vs_speedup(rows, out)
    if figure == "pareto":
        return figures.pareto(others.assign(ar_noise_tv=others["audit_noise_tv"]), out)
    if figure in FRONTIERS:
        return frontier(rows, out)
    return plots.accept_histograms(rows, out)


def command_part(
    page: str, study: Study, i: int, rows: pd.DataFrame, out_dir: Path, powered: pd.DataFrame | None = None
) -> list[str]:
    """One listed command's part of a study section: provenance, key table and figure of its latest run (a frontier
    with the published speedups and the audits with power of its lossless decoders, from `powered`)."""
    if rows.empty:
        return ["Not run yet: no rows in the CSV.", ""]
    rows = latest_run(rows)
    lines = [describe_run(rows), "", markdown(key_table(rows, study.figure)), "", *heads_acceptance_lines(rows)]
    if study.figure and study.figure not in SECTION_KINDS:  # one section for the whole page
        lacking = [c for c in FIGURES[study.figure] if c not in rows or rows[c].isna().all()]
        if lacking:
            return [*lines, f"No {study.figure} figure: these rows have no {', '.join(lacking)}.", ""]
        name = f"{page}_{study.experiment}_{i}_{study.figure}.png"
        draw(study.figure, rows, out_dir / name)
        lines += [f"![{study.figure}]({name})", ""]
        if study.figure in FRONTIERS:
            lines += published_lines(rows, pd.read_csv(PUBLISHED))
            lines += powered_lines(rows, powered)
        if study.figure == "readings":
            lines += readings_lines(rows, pd.read_csv(PUBLISHED))
    return lines


def render_page(
    page: str,
    results: pd.DataFrame,
    studies: list[Study],
    out_dir: Path,
    tables_dir: Path | None = None,
    powered: pd.DataFrame | None = None,
) -> str:
    """The markdown of docs/results/<page>.md; draws its figures into out_dir (and a regime page's
    table into tables_dir, default out_dir). A goal page reads the audits with power from `powered`."""
    listed = {c for s in studies for c in s.commands}
    commands = results["command"] if "command" in results else pd.Series([None] * len(results))
    unlisted = sorted({str(c) for c in commands if c not in listed})
    if unlisted:
        raise ValueError(
            f"results/studies/{page}.csv has rows of commands no study lists in study.commands: {unlisted}"
        )
    lines = [
        f"# Results: {page}",
        "",
        f"Generated by `{GENERATOR}` from `results/studies/{page}.csv`; do not edit by hand. To reproduce, "
        f"run the commands below from a clean tree, then `make docs`. {INTERVAL_LEGEND}",
        "",
    ]
    for study in studies:
        lines += [f"## {study.title} (`experiment={study.experiment}`)", "", study.question, ""]
        for i, command in enumerate(study.commands):
            lines += [f"`{command}`", ""]
            lines += command_part(page, study, i, results[commands == command], out_dir, powered)
    if any(s.figure == "regime" for s in studies):
        lines += regime_section(page, results, studies, out_dir, tables_dir or out_dir, powered)
    calibrations = [c for s in studies if s.figure == "calibration" for c in s.commands]
    if calibrations:
        lines += calibration_section(results, calibrations, pd.read_csv(PUBLISHED))
    goals = [c for s in studies if s.figure == "goal" for c in s.commands]
    if goals:
        lines += goal_section(results, goals, pd.read_csv(PUBLISHED), page_goal(page, studies, "goal"), powered)
    costs = [c for s in studies if s.figure == "cost" for c in s.commands]
    if costs:
        lines += cost_section(results, costs, pd.read_csv(PUBLISHED), tables_dir or out_dir)
    lines += shipped_heads_lines(results, CHECKOUT)
    drafters = [c for s in studies if s.figure == "drafters" for c in s.commands]
    if drafters:
        goal = page_goal(page, studies, "drafters")
        lines += drafters_section(results, drafters, pd.read_csv(PUBLISHED), goal, powered)
    return "\n".join(lines)


def page_goal(page: str, studies: list[Study], figure: str) -> Goal:
    """The one goal of a page's `figure` studies: every overlay writing the page states the same `study.goal`."""
    goals = [s.goal for s in studies if s.figure == figure]
    if any(g != goals[0] for g in goals):
        raise ValueError(f"the studies of page {page!r} state different study.goal blocks; they must agree")
    return goals[0]


def render_headline(results_dir: Path) -> str:
    """README's headline block: the latest rows of HEADLINE's command, with the command and provenance."""
    page, command = HEADLINE
    results = pd.read_csv(results_dir / f"{page}.csv")
    rows = results[results["command"] == command] if "command" in results else results.iloc[:0]
    if rows.empty:
        raise ValueError(f"results/studies/{page}.csv has no rows of the headline command {command!r}: run it")
    rows = latest_run(rows)
    return "\n".join(
        [
            f"`{command}` (page [docs/results/{page}.md](docs/results/{page}.md); {describe_run(rows)})",
            "",
            markdown(key_table(rows, None)),
            "",
            INTERVAL_LEGEND,
        ]
    )


def with_headline(readme: str, block: str) -> str:
    """README text with the headline block between its markers replaced by `block`."""
    begin, end = HEADLINE_MARKERS
    if begin not in readme or end not in readme:
        raise ValueError(f"README.md lacks the headline markers {begin} ... {end}")
    head, rest = readme.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def render_all(results_dir: Path, conf_dir: Path, out_dir: Path, tables_dir: Path | None = None) -> list[Path]:
    """Every page whose CSV is present, and the index; the paths written. A regime page's combined
    table goes to tables_dir (default out_dir; `make docs` passes results/)."""
    pages = load_studies(conf_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written, index = [], []
    powered_csv = results_dir / f"{POWERED_PAGE}.csv"
    powered = pd.read_csv(powered_csv) if powered_csv.exists() else None
    for csv in sorted(results_dir.glob("*.csv")):
        if csv.stem not in pages:
            raise ValueError(f"{csv}: no overlay in {conf_dir} has study.page {csv.stem!r}")
        results = pd.read_csv(csv)
        out = out_dir / f"{csv.stem}.md"
        out.write_text(render_page(csv.stem, results, pages[csv.stem], out_dir, tables_dir, powered))
        written.append(out)
        index.append(f"| [{csv.stem}]({csv.stem}.md) | {'; '.join(s.title for s in pages[csv.stem])} |")
    for render_tool_page, title in TOOL_PAGES:  # a benchmark's page, from its CSV in results/, not a study's
        page = render_tool_page(tables_dir, out_dir) if tables_dir is not None else None
        if page is not None:
            written.append(page)
            index.append(f"| [{page.stem}]({page.name}) | {title} |")
    readme = out_dir / "README.md"
    readme.write_text(
        "\n".join(
            [
                "# Results pages",
                "",
                f"Generated by `{GENERATOR}` (`make docs`) from `results/studies/*.csv`; do not edit by hand. "
                "How a study is written: `experiments/README.md`.",
                "",
                "| page | studies |",
                "| --- | --- |",
                *index,
                "",
            ]
        )
    )
    return [*written, readme]
