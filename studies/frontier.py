"""The quality-against-speed frontier of one run: how far each decoder's samples are from the target's (the
one-sample audit's excess nats a token) against its modelled speedup over AR on a GPU (sjd.harness.pricing)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: figures go straight to files
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

Z95 = 1.96


def excess_interval(rows: pd.DataFrame) -> np.ndarray:
    """Half-width of the excess nats' 95% interval, over the audited tokens (their variance / their count)."""
    return Z95 * np.sqrt(rows["tf_var_nats2"].astype(float) / rows["tf_n_tokens"].astype(float))


def frontier(rows: pd.DataFrame, out: Path) -> Path:
    """Modelled speedup over AR against excess nats a token, one point per decoder with both intervals; o a decoder
    that claims to be lossless, x one that does not; the dashed line joins the decoders no other beats on both."""
    lossless = json.loads(rows["decoder_lossless"].iloc[0])
    table = rows[rows["decoder"] != rows["baseline"].iloc[0]].dropna(subset=["tf_excess_nats", "modelled_speedup"])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    half = excess_interval(table)
    for (_, row), err in zip(table.iterrows(), half):
        y, lo, hi = (
            float(row.get(c, np.nan)) for c in ("modelled_speedup", "modelled_speedup_lo", "modelled_speedup_hi")
        )
        yerr = [[max(y - lo, 0.0)], [max(hi - y, 0.0)]] if np.isfinite(lo) and np.isfinite(hi) else None
        marker = "o" if lossless.get(row["decoder"], True) else "x"
        ax.errorbar(float(row["tf_excess_nats"]), y, xerr=err, yerr=yerr, fmt=marker, capsize=2, ms=6)
        ax.annotate(row["decoder"], (float(row["tf_excess_nats"]), y), fontsize=7, xytext=(4, 3),
                    textcoords="offset points")  # fmt: skip
    front, best = [], -np.inf
    for _, row in table.sort_values(["tf_excess_nats", "modelled_speedup"], ascending=[True, False]).iterrows():
        if row["modelled_speedup"] > best:
            front.append((row["tf_excess_nats"], row["modelled_speedup"]))
            best = row["modelled_speedup"]
    ax.plot(*zip(*front), color="grey", lw=0.8, ls="--")
    ax.axvline(0.0, color="grey", lw=0.5)
    ax.set_xlabel("excess nats a token over the target's own (one-sample audit; 0 = the target's distribution)")
    ax.set_ylabel("modelled speedup over AR (H100, graphed)")
    ax.set_title("o claims lossless, x lossy; bars: 95% intervals", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
