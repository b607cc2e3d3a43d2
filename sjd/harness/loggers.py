"""Loggers. CSV tables under the run directory are always written and are the source of
truth; `logger=wandb` additionally sends the summary, tables, grid and histograms to W&B.

W&B runs offline when no API key is configured (WANDB_API_KEY unset and no explicit mode),
so a run never blocks on the network; `wandb sync <dir>` uploads it later.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

SUMMARY_METRICS = ("step_compression", "latency_s", "latency_speedup", "n_forward", "mean_accepted", "fid", "clip")


class CSVLogger:
    def log_run(self, run_dir: Path, summary: pd.DataFrame, samples: pd.DataFrame, config: dict) -> None:
        """Nothing beyond the run's own CSV/JSON files."""


class WandbLogger:
    def __init__(self, project: str = "sjd", group: str | None = None, mode: str | None = None) -> None:
        self.project, self.group, self.mode = project, group, mode

    def _mode(self) -> str:
        if self.mode:
            return self.mode
        if os.environ.get("WANDB_MODE"):
            return os.environ["WANDB_MODE"]
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"

    def log_run(self, run_dir: Path, summary: pd.DataFrame, samples: pd.DataFrame, config: dict) -> None:
        import wandb  # imported here: wandb is slow to import and only this logger needs it

        run = wandb.init(
            project=self.project,
            group=self.group or config.get("experiment_name"),  # a study's runs side by side
            name=run_dir.name,
            config=config,
            dir=str(run_dir),
            mode=self._mode(),
            reinit="finish_previous",
        )
        try:
            for _, row in summary.iterrows():
                d = row["decoder"]
                for key in SUMMARY_METRICS:
                    if key in row and pd.notna(row[key]):
                        run.summary[f"{d}/{key}"] = float(row[key])
                hist = {int(k): v for k, v in json.loads(row["accept_hist"]).items()}
                lengths = [k for k, v in hist.items() for _ in range(v)]
                run.log({f"{d}/accepted_length": wandb.Histogram(lengths)})
            run.log({"summary": wandb.Table(dataframe=summary.astype(str))})
            per_prompt = samples.drop(columns=["tokens", "accepted"])
            run.log({"samples": wandb.Table(dataframe=per_prompt.astype(str))})
            grid = run_dir / "grid.png"
            if grid.is_file():
                run.log({"grid": wandb.Image(str(grid))})
        finally:
            run.finish()
