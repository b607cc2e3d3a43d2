"""Render the results pages docs/results/<page>.md from the study CSVs results/studies/<page>.csv.

    python scripts/results_pages.py [--results results/studies] [--conf conf/experiment] [--out docs/results]

A study is an overlay in conf/experiment/ with a `study:` block (experiments/README.md): its page,
title, question, the commands whose rows the page shows, and optionally a figure. For every study
CSV present, the page has one section per overlay writing to it, and under it one part per listed
command: the command, the git hash(es), config fingerprint(s) and settings of the rows of its latest
run, a table of the key columns, and the figure. A row whose recorded command no study lists is an
error: the page shows only numbers a named command gives. Also writes docs/results/README.md, the
index of the pages, and the headline table of README.md (between its `<!-- headline:begin -->` and
`<!-- headline:end -->` markers): the part of one study page named by HEADLINE. Figures
(`study.figure`): window (step compression and speedup against the window), quality (FID and CLIP
against speedup), pareto (speedup against audit distance and FID), accept_hist (tokens committed per
forward, one panel per decoder).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from sjd.audit import controls_page
from sjd.harness import plots, regime

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = "python scripts/results_pages.py"
# README's headline: (page, command) of the study part it shows.
HEADLINE = ("toy_schedule", "python run.py experiment=toy_schedule decoder.window=16")
HEADLINE_MARKERS = ("<!-- headline:begin -->", "<!-- headline:end -->")
FIGURES = {  # figure -> the columns its rows need
    "window": ("step_compression", "latency_speedup"),
    "quality": ("latency_speedup", "fid", "clip"),
    "pareto": ("latency_speedup", "audit_tv", "fid", "lossless_expected"),
    "accept_hist": ("accept_hist", "mean_accepted"),
    "regime": ("step_compression", "entropy_nats"),
}
SETTINGS = ("init", "context", "denoise_steps", "coupling", "forced_drafts", "verification", "neighbours",
            "delta", "branches", "branch_depth", "ar_prefix", "schedule")  # fmt: skip
# (column, heading, format): the key columns, each shown where a row of the part has a value.
COLUMNS = (
    ("n_prompts", "samples", "d"),
    ("n_forward", "forwards per image", ".1f"),
    ("step_compression", "step compression", ".2f"),
    ("latency_speedup", "latency speedup", ".2f"),
    ("efficiency", "efficiency", ".2f"),
    ("outside_model_frac", "outside model", ".1%"),
    ("fid", "FID", ".1f"),
    ("clip", "CLIP", ".1f"),
    ("audit_tv", "audit TV", ".3f"),
    ("audit_p", "audit p", ".3g"),
)


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


def latest_run(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the last run among `rows` (the results CSV is appended to in run order)."""
    return rows[rows["run_dir"] == rows["run_dir"].iloc[-1]]


def varying_settings(configs: list[dict]) -> list[str]:
    """The SETTINGS keys whose values differ between these decoders (what tells them apart)."""
    missing = object()
    return [k for k in SETTINGS if len({repr(c.get(k, missing)) for c in configs}) > 1]


def settings_of(config: dict, keys: list[str]) -> str:
    described = ", ".join(f"{k}={config[k]}" for k in keys if k in config)
    return described or "-"


def accepted_length_shares(accept_hist: str) -> tuple[float, float]:
    """Share of forwards that commit one token, and share of tokens committed by forwards of more than 40."""
    hist = {int(k): v for k, v in json.loads(accept_hist).items()}
    tokens = sum(k * v for k, v in hist.items())
    return hist.get(1, 0) / sum(hist.values()), sum(k * v for k, v in hist.items() if k > 40) / tokens


def cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if fmt == "d":
        return str(int(value))
    return format(float(value), fmt)


def key_table(rows: pd.DataFrame, figure: str | None) -> pd.DataFrame:
    """The part's table: decoder, window, the settings that tell its decoders apart, then every key
    column some row has, step compression over SJD's when the run has a decoder named sjd, and for an
    accept_hist study the shares of short and long accepted lengths."""
    configs = json.loads(rows["decoder_configs"].iloc[0])
    per_row = [configs.get(d, {}) for d in rows["decoder"]]
    baseline = rows["baseline"].iloc[0] if "baseline" in rows else None
    keys = varying_settings([c for d, c in zip(rows["decoder"], per_row) if d != baseline])
    table = pd.DataFrame(
        {
            "decoder": rows["decoder"].tolist(),
            "window": [str(c.get("window", "")) for c in per_row],
            "settings": [settings_of(c, keys) for c in per_row],
        }
    )
    for column, heading, fmt in COLUMNS:
        if column in rows and rows[column].notna().any():
            table[heading] = [cell(v, fmt) for v in rows[column]]
        if column == "step_compression" and "sjd" in set(rows["decoder"]):
            sjd = float(rows.loc[rows["decoder"] == "sjd", "step_compression"].iloc[0])
            table["vs sjd"] = [cell(v / sjd, ".2f") for v in rows["step_compression"]]
    if figure == "accept_hist":
        shares = [accepted_length_shares(h) for h in rows["accept_hist"]]
        table["forwards committing 1 token"] = [cell(one, ".0%") for one, _ in shares]
        table["tokens from forwards committing > 40"] = [cell(long, ".0%") for _, long in shares]
    return table


def markdown(table: pd.DataFrame) -> str:
    head = "| " + " | ".join(table.columns) + " |"
    text = ("decoder", "settings", "model", "anchor", "schedule")
    rule = "| " + " | ".join("---" if c in text else "---:" for c in table.columns) + " |"
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def draw(figure: str, rows: pd.DataFrame, out: Path) -> Path:
    """One of FIGURES for the rows of one run."""
    configs = json.loads(rows["decoder_configs"].iloc[0])
    baseline = rows["baseline"].iloc[0] if "baseline" in rows else None
    others = rows[rows["decoder"] != baseline]
    if figure == "window":
        table = others.assign(window=[configs[d]["window"] for d in others["decoder"]])
        return plots.window_sweep(table, out)
    if figure == "quality":
        return plots.quality_vs_speedup(rows, out)
    if figure == "pareto":
        return plots.pareto(others.assign(ar_noise_tv=others["audit_noise_tv"]), out)
    return plots.accept_histograms(rows, out)


def describe_run(rows: pd.DataFrame) -> str:
    def values(column: str) -> str:
        found = [str(v) for v in dict.fromkeys(rows[column].dropna())] if column in rows else []
        return ", ".join(f"`{v}`" for v in found) or "not recorded"

    first = rows.iloc[0]
    seeds = int(first["seeds_per_prompt"]) if "seeds_per_prompt" in rows and pd.notna(first["seeds_per_prompt"]) else 1
    parts = [
        f"git {values('git_hash')}",
        f"config fingerprint {values('config_fingerprint')}",
        f"model `{first['model']}`",
        f"prompts `{first['prompt_set']}` ({first['prompt_selection']}), {seeds} seed(s) each",
        f"batch size {first['batch_size']}",
        f"device `{first['device']}`",
    ]
    if "audit_noise_tv" in rows and rows["audit_noise_tv"].notna().any():
        parts.append(
            f"audit: {int(first['audit_n'])} samples of one caption per decoder against AR's; AR against AR "
            f"(noise floor of audit TV) {first['audit_noise_tv']:.3f}"
        )
    return "; ".join(parts) + "."


def render_page(
    page: str, results: pd.DataFrame, studies: list[Study], out_dir: Path, tables_dir: Path | None = None
) -> str:
    """The markdown of docs/results/<page>.md; draws its figures into out_dir (and a regime page's
    table into tables_dir, default out_dir)."""
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
        "run the commands below from a clean tree, then `make docs`.",
        "",
    ]
    for study in studies:
        lines += [f"## {study.title} (`experiment={study.experiment}`)", "", study.question, ""]
        for i, command in enumerate(study.commands):
            lines += [f"`{command}`", ""]
            rows = results[commands == command]
            if rows.empty:
                lines += ["Not run yet: no rows in the CSV.", ""]
                continue
            rows = latest_run(rows)
            lines += [describe_run(rows), "", markdown(key_table(rows, study.figure)), ""]
            if study.figure and study.figure != "regime":  # the regime map is one figure for the whole page
                lacking = [c for c in FIGURES[study.figure] if c not in rows or rows[c].isna().all()]
                if lacking:
                    lines += [f"No {study.figure} figure: these rows have no {', '.join(lacking)}.", ""]
                    continue
                name = f"{page}_{study.experiment}_{i}_{study.figure}.png"
                draw(study.figure, rows, out_dir / name)
                lines += [f"![{study.figure}]({name})", ""]
    if any(s.figure == "regime" for s in studies):
        lines += regime_section(page, results, studies, out_dir, tables_dir or out_dir)
    return "\n".join(lines)


PUBLISHED = ROOT / "results" / "paper" / "published.csv"
CONTROLS_CSV, CONTROLS_PAGE = ROOT / "results" / "audit_controls.csv", ROOT / "docs" / "audit_controls.md"
REGIME_SHOWN = (("entropy_nats", ".2f"), ("step_compression", ".2f"), ("vs_official_sjd", ".2f"),
                ("vs_harness_sjd", ".2f"), ("latency_speedup", ".2f"), ("efficiency", ".2f"), ("audit_p", ".3g"),
                ("audit_tv", ".3f"), ("audit_noise_tv", ".3f"))  # fmt: skip


def regime_section(
    page: str, results: pd.DataFrame, studies: list[Study], out_dir: Path, tables_dir: Path
) -> list[str]:
    """The combined table of every listed command's latest run (also written as <tables_dir>/<page>.csv),
    its figure, the published-ratio anchors per model, and the restated goal (sjd.harness.regime)."""
    commands = results["command"] if "command" in results else pd.Series([None] * len(results))
    runs = [latest_run(results[commands == c]) for s in studies for c in s.commands if (commands == c).any()]
    if not runs:
        return ["No regime map yet: no listed command has rows.", ""]
    table = regime.regime_table(runs)
    tables_dir.mkdir(parents=True, exist_ok=True)
    table.to_csv(tables_dir / f"{page}.csv", index=False, float_format="%.6g")
    figure = f"{page}.png"
    plots.regime_map(table, out_dir / figure)
    shown = table[["model", "decoder", "schedule", "window", "lossless", "audited_lossless"]].astype(str)
    shown["audited_lossless"] = [regime.flag_text(v) for v in table["audited_lossless"]]
    for column, fmt in REGIME_SHOWN:
        shown[column] = [cell(v, fmt) for v in table[column]]
    lines = ["## The regime map", "",
             f"All the runs above in one table (also `results/{page}.csv`), ordered by the model's per-token "
             "entropy. `vs_official_sjd` and `vs_harness_sjd` are step compression over SJD's in the same run; "
             f"`lossless` is the decoder's claim; {regime.AUDITED_TEXT}", "", f"![regime map]({figure})", "",
             markdown(shown), ""]  # fmt: skip
    anchors = regime.anchors(table, pd.read_csv(PUBLISHED))
    anchor_table = anchors[["model", "anchor"]].copy()
    for column in ("entropy_nats", "ours", "published", "ours_over_published"):
        anchor_table[column] = [cell(v, ".2f") for v in anchors[column]]
    lines += ["## Against the published ratios", "",
              "Each model's SJD step compression over AR (official schedule, window 16), and SCD's and "
              "SJD-PAC's (official schedule, window 64) over that SJD's, next to what the papers report on "
              "Lumina-mGPT 7B (`results/paper/published.csv`); 1.00 in the last column reproduces the paper.", "",
              markdown(anchor_table), ""]  # fmt: skip
    lines += ["## Twice official SJD, losslessly", ""]
    shown_decoders = set()
    for schedule in (None, "official"):
        best = regime.goal(table, schedule=schedule)
        among = "" if schedule is None else " among the decoders on the official schedule"
        if best is None:
            lines += ["No run has official-schedule SJD at window 16.", ""]
            break
        if best["decoder"] in shown_decoders:  # the best decoder overall is on the official schedule
            continue
        shown_decoders.add(best["decoder"])
        if best["decoder"] is None:
            lines += [regime.not_audited_text(best["model"], among, table), ""]
            continue
        lines += [
            f"On `{best['model']}`, the model whose official-schedule SJD at window 16 compresses closest to the "
            f"published {regime.SJD_PUBLISHED:.2f}x, the audited lossless decoder with the highest step compression "
            f"at window 16{among} is `{best['decoder']}`: {best['vs_official_sjd']:.2f}x official-schedule SJD's "
            f"step compression (target 2x) and {best['vs_harness_sjd']:.2f}x harness-schedule SJD's (target 1.5x); "
            f"latency speedup {best['latency_speedup']:.2f} and efficiency {best['efficiency']:.2f} over AR; "
            f"one-sample audit p = {best['tf_p']:.3g} on {int(best['tf_n_tokens'])} tokens.",
            "",
        ]
    lines += [
        "Reading these: a stand-in's forward is a tiny network's, far cheaper than the bookkeeping around it on a "
        "CPU, so its latency speedups say little about a 7B model on a GPU; step compression is what carries over. "
        + regime.power_text(table),
        "",
    ]
    return lines


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
    for csv in sorted(results_dir.glob("*.csv")):
        if csv.stem not in pages:
            raise ValueError(f"{csv}: no overlay in {conf_dir} has study.page {csv.stem!r}")
        results = pd.read_csv(csv)
        out = out_dir / f"{csv.stem}.md"
        out.write_text(render_page(csv.stem, results, pages[csv.stem], out_dir, tables_dir))
        written.append(out)
        index.append(f"| [{csv.stem}]({csv.stem}.md) | {'; '.join(s.title for s in pages[csv.stem])} |")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "studies")
    ap.add_argument("--conf", type=Path, default=ROOT / "conf" / "experiment")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md", help="README whose headline block to fill")
    args = ap.parse_args()
    for path in render_all(args.results, args.conf, args.out, ROOT / "results"):
        print(path)
    args.readme.write_text(with_headline(args.readme.read_text(), render_headline(args.results)))
    print(args.readme)
    if CONTROLS_CSV.is_file():  # the audits' negative controls (scripts/audit_controls.py)
        CONTROLS_PAGE.write_text(controls_page.render(pd.read_csv(CONTROLS_CSV)))
        print(CONTROLS_PAGE)


if __name__ == "__main__":
    main()
