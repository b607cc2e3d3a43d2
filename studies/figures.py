"""PNG figures of the results pages that compare runs: a window sweep, quality against speed, the Pareto view and
the regime map (matplotlib, headless). A run's own figure (its acceptance histograms) is sjd.harness.plots."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: figures go straight to files

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def window_sweep(table: pd.DataFrame, out: Path) -> Path:
    """Step compression and latency speedup against the window length."""
    table = table.sort_values("window")
    fig, ax = plt.subplots(figsize=(4.6, 3.2))
    ax.plot(table["window"], table["step_compression"], "o-", label="step compression")
    ax.plot(table["window"], table["latency_speedup"], "s-", label="latency speedup vs AR")
    ax.set_xscale("log", base=2)
    ax.set_xticks(table["window"], [str(w) for w in table["window"]])
    ax.set_xlabel("window length")
    ax.set_ylabel("x AR")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def quality_vs_speedup(table: pd.DataFrame, out: Path) -> Path:
    """FID and CLIP score against latency speedup, one point per decoder (and model)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, metric, better in ((axes[0], "fid", "lower is better"), (axes[1], "clip", "higher is better")):
        for _, row in table.iterrows():
            label = (
                row["decoder"]
                if "model" not in row or row["model"] == table["model"].iloc[0]
                else (f"{row['decoder']} ({row['model']})")
            )
            marker = "o" if row.get("lossless_expected", True) else "x"
            ax.scatter(row["latency_speedup"], row[metric], marker=marker)
            ax.annotate(label, (row["latency_speedup"], row[metric]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")  # fmt: skip
        ax.set_xlabel("latency speedup vs AR (same model, same run)")
        ax.set_ylabel(f"{metric.upper()} ({better})")
        ax.grid(alpha=0.3)
    axes[0].set_title("o lossless, x lossy", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def pareto(table: pd.DataFrame, out: Path) -> Path:
    """Latency speedup against audit distance (TV to AR) and against FID, one point per decoder;
    the upper-left frontier (faster and closer to AR) is drawn as a line."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, metric, label in (
        (axes[0], "audit_tv", "audit: mean per-position TV to AR (lower = closer)"),
        (axes[1], "fid", "FID (lower is better)"),
    ):
        for _, row in table.iterrows():
            marker = "o" if row["lossless_expected"] else "x"
            ax.scatter(row[metric], row["latency_speedup"], marker=marker)
            ax.annotate(row["decoder"], (row[metric], row["latency_speedup"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")  # fmt: skip
        front, best = [], -1.0
        for _, row in table.sort_values([metric, "latency_speedup"], ascending=[True, False]).iterrows():
            if row["latency_speedup"] > best:
                front.append((row[metric], row["latency_speedup"]))
                best = row["latency_speedup"]
        ax.plot(*zip(*front), color="grey", lw=0.8, ls="--")
        ax.axvline(table["ar_noise_tv"].iloc[0], color="grey", lw=0.5) if metric == "audit_tv" else None
        ax.set_xlabel(label)
        ax.set_ylabel("latency speedup vs AR (same run)")
        ax.grid(alpha=0.3)
    axes[0].set_title("o lossless, x lossy; vertical line: AR vs AR noise floor", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def regime_map(table: pd.DataFrame, out: Path) -> Path:
    """Step compression over official-schedule SJD against the models' per-token entropy, one panel per
    window, one colour per decoder (o lossless, x lossy), a thin line joining its models in entropy order."""
    windows = sorted(int(w) for w in table["window"].unique() if int(w) > 1)
    rows = table[table["decoder"] != "ar"]
    colours = plt.get_cmap("tab20")
    fig, axes = plt.subplots(1, len(windows), figsize=(6.5 * len(windows), 4.5), squeeze=False)
    for ax, window in zip(axes[0], windows):
        for i, (decoder, part) in enumerate(rows[rows["window"] == window].groupby("decoder", sort=False)):
            part = part.sort_values("entropy_nats")
            marker = "o" if bool(part["lossless"].iloc[0]) else "x"
            ax.plot(part["entropy_nats"], part["vs_official_sjd"], marker=marker, linewidth=0.6, linestyle=":",
                    color=colours(i % 20), label=decoder)  # fmt: skip
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xlabel("per-token entropy of AR's sampling distribution (nats)")
        ax.set_ylabel("step compression / official-schedule SJD's")
        ax.set_title(f"window {window} (o lossless, x lossy; one point per model)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
