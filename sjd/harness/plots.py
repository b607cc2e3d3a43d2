"""PNG figures of a run, drawn from its summary table (matplotlib, headless)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: figures go straight to files
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def accept_histograms(summary: pd.DataFrame, out: Path) -> Path:
    """Share of forwards that committed k tokens, one panel per decoder."""
    n = len(summary)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 2.6), squeeze=False, sharey=True)
    for ax, (_, row) in zip(axes[0], summary.iterrows()):
        hist = {int(k): v for k, v in json.loads(row["accept_hist"]).items()}
        total = sum(hist.values())
        ax.bar(list(hist), [v / total for v in hist.values()], color="tab:blue")
        ax.set_title(f"{row['decoder']} (mean {row['mean_accepted']:.2f})", fontsize=9)
        ax.set_xlabel("tokens committed per forward")
    axes[0][0].set_ylabel("share of forwards")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
