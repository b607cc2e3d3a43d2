"""Run outputs: samples.jsonl (incremental), images, grid.png, summary.csv/json, results row.

samples.jsonl is the source of truth: one line per prompt per decoder, appended and flushed
as soon as the prompt is done, so an interrupted run keeps what it finished. Under torchrun each
rank appends to its own samples.rank{r}.jsonl instead; at the end `merge_samples` gathers every
sample file into samples.jsonl, one line per (decoder, prompt) in prompt order, whatever the
number of ranks. The summary is computed from those lines with pandas.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from PIL import Image, ImageDraw

from sjd.decoders.base import DecodeResult
from sjd.decoders.stages import STAGES
from sjd.harness.intervals import summary_intervals
from sjd.harness.model_range import priced, ratio_range
from sjd.harness.pricing import sample_prices
from sjd.types import Prompt

STAGE_COLUMNS = [f"{stage}_frac" for stage in STAGES]
SUMMARY_COLUMNS = [
    "model",
    "decoder",
    "schedule",
    "n_prompts",
    "n_captions",
    "n_tokens",
    "entropy_nats",
    "n_forward",
    "step_compression",
    "inputs_per_token",
    "latency_s",
    "latency_speedup",
    "prefill_s",
    "decode_s",
    "standin_model_s",
    "image_decode_s",
    "outside_model_frac",
    "forward_cost",
    "efficiency",
    "drafter_forwards",
    "drafter_cost",
    "head_forwards",
    "heads",
    "draft_head_rows",
    "priced_forwards",
    "fe_compression",
    "modelled_s",
    "modelled_speedup",
    "modelled_efficiency",
    "modelled_eager_s",
    "modelled_eager_speedup",
    "modelled_eager_efficiency",
    "priced_context",
    "priced_width",
    "decoder_ops_per_iter",
    "syncs_per_iter",
    *STAGE_COLUMNS,
    "mean_accepted",
    "accept_hist",
    "peak_mem_mb",
    "peak_mem_kind",
]


MERGED = "samples.jsonl"


@dataclass(frozen=True)
class SampleRecord:
    """One line of samples.jsonl: one decoder's sample of one prompt at one seed index, what it
    cost, and the decoder's own extras (e.g. the tree decoder's `branch_commits`). The field order
    is the line's key order. Times, the batch size and the peak memory are those of the batch the
    sample was decoded in."""

    prompt_id: str
    prompt: str
    seed_index: int
    seed: int  # the prompt's generator seed, a hash of (run seed + seed index, prompt id)
    decoder: str
    n_tokens: int
    n_forward: int
    latency_s: float
    prefill_s: float
    decode_s: float
    model_s: float
    stage_s: dict[str, float]
    image_decode_s: float  # per image; NaN when no image was decoded
    batch_size: int
    peak_mem_mb: float
    peak_mem_kind: str
    accepted: list[int]  # tokens committed by each forward
    entropy_nats: float | None
    tokens: list[int]
    extras: dict[str, Any] = field(default_factory=dict)
    # The batch this sample was timed in, named by its first sample (prompt_id#seed_index): the unit of the
    # latency intervals (sjd.harness.intervals.batch_units). Empty on lines written before it was recorded.
    timed_batch: str = ""
    # Under a shadow (sjd/harness/shadow.py), the seconds of the model's own calls, which the latency leaves out
    # (the shadow's forwards are the timed ones); 0 without a shadow, where the model's forwards are the timed ones.
    standin_model_s: float = 0.0

    @classmethod
    def of_row(
        cls,
        result: DecodeResult,
        row: int,
        prompt: Prompt,
        seed_index: int,
        seed: int,
        decoder: str,
        image_decode_s: float,
        peak_mem: tuple[float, str],
        timed_batch: str = "",
    ) -> SampleRecord:
        """Row `row` of a batch's `result`, timed in the batch named `timed_batch`."""
        return cls(
            prompt_id=prompt.prompt_id,
            prompt=prompt.text,
            seed_index=seed_index,
            seed=seed,
            decoder=decoder,
            n_tokens=int(result.tokens.shape[1]),
            n_forward=result.n_forward[row],
            latency_s=result.latency_s,
            prefill_s=result.prefill_s,
            decode_s=result.decode_s,
            model_s=result.model_s,
            stage_s=result.stage_s,
            image_decode_s=image_decode_s,
            batch_size=len(result.tokens),
            peak_mem_mb=peak_mem[0],
            peak_mem_kind=peak_mem[1],
            accepted=result.accepted[row],
            entropy_nats=None if result.entropy_nats is None else result.entropy_nats[row],
            tokens=result.tokens[row].tolist(),
            extras=row_extras(result.extras, row, len(result.tokens)),
            timed_batch=timed_batch,
            standin_model_s=result.set_aside_s,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def inputs_per_token(df: pd.DataFrame) -> float:
    """Window inputs forwarded after the prefill per generated token (AR: about 1), the compute a
    decoder's forwards take whatever the hardware; NaN where a decoder does not record them."""
    if "extras" not in df:
        return float("nan")
    inputs = [e.get("window_inputs") if isinstance(e, dict) else None for e in df["extras"]]
    if any(i is None for i in inputs):
        return float("nan")
    return float(sum(inputs) / df["n_tokens"].sum())


def drafter_costs(df: pd.DataFrame) -> dict[str, float]:
    """A trained drafter's work, where the decoder has one (NaN elsewhere): its forwards per image
    (`drafter_forwards`, beside the target's `n_forward`) and its time per forward over the target's model time
    per forward in the same samples (`drafter_cost`; drafter time is the `drafter` stage: its network, the
    target's head on its features and the pipeline that makes q)."""
    counts = [e.get("drafter_forwards") if isinstance(e, dict) else None for e in df.get("extras", [])]
    if not len(counts) or any(c is None for c in counts):
        return {"drafter_forwards": float("nan"), "drafter_cost": float("nan")}
    drafter_s = sum(split.get("drafter", 0.0) for split in df["stage_s"]) if "stage_s" in df else float("nan")
    per_drafter = drafter_s / max(sum(counts), 1)
    per_target = float(df["model_s"].sum() / df["n_forward"].sum())
    return {"drafter_forwards": float(sum(counts) / len(counts)), "drafter_cost": per_drafter / per_target}


def head_counts(df: pd.DataFrame) -> dict[str, float]:
    """Draft-head calls per image and heads per call, where the decoder has heads (NaN elsewhere)."""
    extras = [e if isinstance(e, dict) else {} for e in df.get("extras", [])]
    if not extras or any("head_forwards" not in e for e in extras):
        return {"head_forwards": float("nan"), "heads": float("nan")}
    return {"head_forwards": float(np.mean([e["head_forwards"] for e in extras])),
            "heads": float(max(e.get("heads", 0) for e in extras))}  # fmt: skip


def row_extras(extras: dict[str, Any], row: int, batch: int) -> dict[str, Any]:
    """One row's share of a batch's extras: a list (or tensor) with one entry per row gives that
    row's entry; any other value describes the whole batch and is kept as it is."""
    out = {}
    for key, value in extras.items():
        if isinstance(value, torch.Tensor):
            value = value.tolist()
        out[key] = value[row] if isinstance(value, list | tuple) and len(value) == batch else value
    return out


def shard_file(run_dir: Path, rank: int) -> Path:
    """Where rank `rank` of a torchrun run appends its samples."""
    return run_dir / f"samples.rank{rank}.jsonl"


def sample_files(run_dir: Path) -> list[Path]:
    """samples.jsonl and every rank's shard (of this run or of an earlier one with other ranks)."""
    files = [run_dir / MERGED] + sorted(run_dir.glob("samples.rank*.jsonl"))
    return [f for f in files if f.is_file()]


class SampleWriter:
    """Appends one JSON line per finished sample; each line is written whole and flushed."""

    def __init__(self, run_dir: Path, path: Path | None = None) -> None:
        self.path = path or run_dir / MERGED
        self.images = run_dir / "images"
        self.images.mkdir(parents=True, exist_ok=True)

    def write(self, record: SampleRecord) -> None:
        line = json.dumps(record.to_json(), separators=(",", ":")) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def save_image(self, decoder: str, prompt_id: str, pixels: np.ndarray) -> Path:
        out = self.images / decoder / f"{prompt_id}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp.png")
        Image.fromarray(pixels).save(tmp)
        tmp.replace(out)  # atomic: a killed run never leaves half an image
        return out


def _whole_lines(path: Path, repair: bool) -> list[str]:
    """The complete lines of a sample file. A run killed while writing can leave a half line at
    the end: with `repair` it is cut off, so the resumed run appends cleanly."""
    data = path.read_bytes()
    good = data[: data.rfind(b"\n") + 1]  # everything up to the last newline is whole lines
    if repair and len(good) != len(data):
        path.write_bytes(good)
    return good.decode("utf-8").splitlines()


SampleKey = tuple[str, str, int]  # (decoder, prompt id, seed index)


def _key(line: str) -> SampleKey:
    record = json.loads(line)
    return record["decoder"], str(record["prompt_id"]), int(record.get("seed_index", 0))


def image_name(prompt_id: str, seed_index: int) -> str:
    """A sample's image file stem: the prompt id, and its seed index when there are several."""
    return prompt_id if seed_index == 0 else f"{prompt_id}_s{seed_index}"


def finished_samples(run_dir: Path) -> set[SampleKey]:
    """(decoder, prompt_id, seed_index) of every complete line of samples.jsonl and of the rank
    shards. Cuts half lines off: call it only while no rank is writing."""
    return {_key(line) for path in sample_files(run_dir) for line in _whole_lines(path, repair=True)}


def merge_samples(run_dir: Path, decoders: list[str], samples: list[str | tuple[str, int]]) -> Path:
    """Rewrite samples.jsonl with every sample of samples.jsonl and the rank shards, one line per
    (decoder, prompt, seed index), in sample order and then decoder order; then remove the shards.
    `samples` are prompt ids (seed index 0) or (prompt id, seed index) pairs.

    The same line in two files (a shard and an earlier merge) is kept once; two different samples
    of one (decoder, prompt) or a missing one is an error. The file is replaced atomically, so a
    run killed while merging still holds every sample."""
    lines: dict[SampleKey, str] = {}
    for path in sample_files(run_dir):
        for line in _whole_lines(path, repair=False):
            key = _key(line)
            if key in lines and lines[key] != line:
                raise ValueError(
                    f"{path}: a second, different sample of decoder {key[0]!r} on prompt {key[1]!r} "
                    f"(seed index {key[2]})"
                )
            lines[key] = line
    keys = [s if isinstance(s, tuple) else (s, 0) for s in samples]
    wanted = [(d, p, k) for p, k in keys for d in decoders]
    unexpected = sorted(set(lines) - set(wanted))
    missing = [k for k in wanted if k not in lines]
    if unexpected or missing:
        raise ValueError(
            f"{run_dir}: samples do not match this run's decoders x prompts: missing {missing[:5]} "
            f"({len(missing)} in all), unexpected {unexpected[:5]} ({len(unexpected)} in all)"
        )
    merged, tmp = run_dir / MERGED, run_dir / f"{MERGED}.tmp"
    with tmp.open("w", encoding="utf-8") as f:
        f.writelines(lines[k] + "\n" for k in wanted)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(merged)
    for shard in run_dir.glob("samples.rank*.jsonl"):
        shard.unlink()
    return merged


def read_samples(run_dir: Path) -> pd.DataFrame:
    return pd.read_json(run_dir / "samples.jsonl", lines=True, dtype={"prompt_id": str})


def accept_histogram(accepted_lists) -> dict[int, int]:
    counts = Counter(a for acc in accepted_lists for a in acc)
    return {int(k): int(v) for k, v in sorted(counts.items())}


def summary_rows(samples: pd.DataFrame, baseline: str | None, meta: dict) -> pd.DataFrame:
    """One row per decoder. Step compression is a ratio of sums (tokens / forwards); the
    latency speedup is the baseline's mean latency over this decoder's, on the same prompts.

    The decode wall time (after prefill) is split by stage, each a ratio of sums over the
    decoder's samples (sjd.decoders.stages): draft_frac (window inputs, drafts and their q),
    forward_frac (model forwards), pipeline_frac (finite check and logits -> probabilities),
    verify_frac (acceptance, residual and next-draft sampling; AR's sample), commit_frac
    (writing accepted tokens into the decoder state) and other_frac (the rest: loop control and
    the laps themselves). They sum to 1 up to the device clock; NaN for samples without a split.

    Beside them, the standard errors and 95% intervals of sjd.harness.intervals (forwards per image,
    latency, step compression; latency speedup and efficiency over the baseline and step compression
    over a reference SJD, from a paired bootstrap over prompts)."""
    samples = samples.assign(**sample_prices(samples, meta))  # priced_forwards, modelled_s (sjd.harness.pricing)
    rows = [decoder_row(decoder, df, meta) for decoder, df in samples.groupby("decoder", sort=False)]
    summary = with_baseline_ratios(pd.DataFrame(rows), baseline, meta.get("drafter_byte_ratio"))
    summary = summary[SUMMARY_COLUMNS].merge(summary_intervals(samples, baseline), on="decoder", how="left")
    if isinstance(meta.get("warmup_s"), dict):  # per decoder: its warm-up (and compile) seconds
        summary["warmup_s"] = summary["decoder"].map(meta["warmup_s"])
    for key, value in meta.items():
        if key not in summary.columns:
            summary[key] = value if not isinstance(value, dict | list) else json.dumps(value, sort_keys=True)
    return with_modelled_ranges(summary, baseline)


MODELLED_RANGES = ("modelled_speedup", "modelled_efficiency")


def with_modelled_ranges(summary: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """`modelled_speedup_range_lo/hi` and `modelled_efficiency_range_lo/hi`: each modelled ratio to the baseline
    over the plausible range of the cost model's constants (every engine, the bandwidth reached, launch, call and
    sync costs: sjd.harness.model_range) and over prompts, where `modelled_*_lo/hi` are over prompts alone at the
    default engine. NaN for the baseline and for rows the model cannot price."""
    columns = {f"{c}_range_{end}": [np.nan] * len(summary) for c in MODELLED_RANGES for end in ("lo", "hi")}
    bases = summary[summary["decoder"] == baseline]
    base = bases.iloc[0] if len(bases) else None
    for i, (_, row) in enumerate(summary.iterrows()):
        if base is None or row["decoder"] == baseline or not (priced(row) and priced(base)):
            continue
        for ratio, scale in (("modelled_speedup", 1.0), ("modelled_efficiency", row["n_forward"] / base["n_forward"])):
            point, lo, hi = row.get(ratio), row.get(f"{ratio}_lo"), row.get(f"{ratio}_hi")
            spread = (lo / point, hi / point) if point and np.isfinite([point, lo, hi]).all() else (np.nan, np.nan)
            span = ratio_range(row, [base], [spread], scale)
            columns[f"{ratio}_range_lo"][i], columns[f"{ratio}_range_hi"][i] = span.lo, span.hi
    return summary.assign(**columns)


def decoder_row(decoder: str, df: pd.DataFrame, meta: dict) -> dict:
    """One decoder's summary row from its samples (summary_rows), before any ratio to the baseline."""
    hist = accept_histogram(df["accepted"])
    n_iter = sum(hist.values())
    return {
        "model": meta["model"],
        "decoder": decoder,
        "schedule": meta.get("decoder_configs", {}).get(decoder, {}).get("schedule", ""),  # "" for AR
        "n_prompts": len(df),
        # the intervals' units: distinct prompts (a prompt's seeds are one unit)
        "n_captions": int(df["prompt_id"].nunique()) if "prompt_id" in df else len(df),
        "n_tokens": float(df["n_tokens"].mean()),
        "entropy_nats": mean_entropy(df),
        "n_forward": float(df["n_forward"].mean()),
        "step_compression": float(df["n_tokens"].sum() / df["n_forward"].sum()),
        "inputs_per_token": inputs_per_token(df),
        **drafter_costs(df),
        **head_counts(df),
        "priced_forwards": float(df["priced_forwards"].mean()),
        "latency_s": float(df["latency_s"].mean()),
        "prefill_s": float(df["prefill_s"].mean()),
        "decode_s": float(df["decode_s"].mean()),
        # a shadowed run's model calls, timed apart from the latency (NaN on lines written before they were)
        "standin_model_s": float(df["standin_model_s"].mean()) if "standin_model_s" in df else float("nan"),
        "image_decode_s": float(df["image_decode_s"].mean()) if "image_decode_s" in df else float("nan"),
        "outside_model_frac": float(1 - df["model_s"].sum() / df["latency_s"].sum()),
        "model_s": float(df["model_s"].mean()),
        "modelled_s": float(df["modelled_s"].mean()),
        "modelled_eager_s": float(df["modelled_eager_s"].mean()),
        **priced_counts(df),
        **stage_fractions(df),
        "mean_accepted": float(sum(k * v for k, v in hist.items()) / max(n_iter, 1)),
        "accept_hist": json.dumps(hist),
        "peak_mem_mb": float(df["peak_mem_mb"].max()),
        "peak_mem_kind": df["peak_mem_kind"].iloc[0],
    }


MODELLED_RATIOS = ("modelled_speedup", "modelled_efficiency", "modelled_eager_speedup", "modelled_eager_efficiency")


def with_baseline_ratios(summary: pd.DataFrame, baseline: str | None, drafter_price: float | None) -> pd.DataFrame:
    """The summary with every ratio to the baseline: fe_compression, latency speedup, the modelled speedups and
    efficiencies of both engines, forward cost and efficiency; NaN without a baseline in the run."""
    summary["fe_compression"] = fe_compression(summary, baseline, drafter_price)
    if baseline is None or baseline not in set(summary["decoder"]):
        for column in ("latency_speedup", "forward_cost", "efficiency", *MODELLED_RATIOS):
            summary[column] = float("nan")
        return summary
    base = summary.loc[summary["decoder"] == baseline].iloc[0]
    summary["latency_speedup"] = base["latency_s"] / summary["latency_s"]
    for engine in ("", "eager_"):  # modelled speedup over the baseline, and over the step compression
        speedup = base[f"modelled_{engine}s"] / summary[f"modelled_{engine}s"]
        summary[f"modelled_{engine}speedup"] = speedup
        summary[f"modelled_{engine}efficiency"] = speedup * summary["n_forward"] / base["n_forward"]
    summary["forward_cost"], summary["efficiency"] = forward_efficiency(summary, base)
    return summary


def fe_compression(summary: pd.DataFrame, baseline: str | None, drafter_price: float | None) -> pd.Series:
    """Forward-equivalent compression: the baseline's forwards per image over the decoder's target forwards plus
    its drafter forwards priced at `drafter_price` target forwards each (the drafter's weight bytes over the
    target's, sjd.core.cost). For a decoder without a drafter it is the baseline's forwards over its own; NaN
    without a baseline, and for a drafter decoder on a model with no price."""
    if baseline is None or baseline not in set(summary["decoder"]):
        return pd.Series(float("nan"), index=summary.index)
    from sjd.core.cost import priced_forwards

    base = float(summary.loc[summary["decoder"] == baseline, "n_forward"].iloc[0])
    price = float("nan") if drafter_price is None else float(drafter_price)
    priced = priced_forwards(summary["n_forward"], summary["drafter_forwards"], price)
    if "priced_forwards" in summary:  # the samples' own, draft heads included, where the model has a price
        priced = summary["priced_forwards"].where(summary["priced_forwards"].notna(), priced)
    if "head_forwards" in summary:  # heads on a model with no price: not comparable
        priced = priced.where((summary["head_forwards"].fillna(0) == 0) | summary["priced_forwards"].notna())
    return base / priced


def priced_counts(df: pd.DataFrame) -> dict[str, float]:
    """The counts a GPU pays for (sjd.harness.pricing), over one decoder's samples: the mean context and width
    of a target forward (weighted by forwards) and the decoder's calls and syncs per iteration."""
    forwards = df["n_forward"].astype(float)
    weighted = {c: float((df[c] * forwards).sum() / forwards.sum()) for c in ("priced_context", "priced_width")}
    kept = float(df["draft_head_rows"].iloc[0]) if "draft_head_rows" in df else float("nan")
    return {**weighted, "decoder_ops_per_iter": float(df["decoder_ops_per_iter"].mean()),
            "syncs_per_iter": float(df["syncs_per_iter"].mean()), "draft_head_rows": kept}  # fmt: skip


def mean_entropy(df: pd.DataFrame) -> float:
    """The samples' mean per-token entropy of the sampling distribution (nats), where the decoder
    measured it (AR); NaN otherwise, and for samples written before it was recorded."""
    if "entropy_nats" not in df:
        return float("nan")
    values = pd.to_numeric(df["entropy_nats"], errors="coerce")
    return float(values.mean()) if values.notna().all() else float("nan")


def stage_fractions(df: pd.DataFrame) -> dict[str, float]:
    """Seconds per stage summed over samples, over their summed decode seconds."""
    if "stage_s" not in df or not all(isinstance(split, dict) and split for split in df["stage_s"]):
        return dict.fromkeys(STAGE_COLUMNS, float("nan"))
    decode = float(df["decode_s"].sum())
    if decode <= 0:
        return dict.fromkeys(STAGE_COLUMNS, float("nan"))
    return {f"{stage}_frac": sum(split.get(stage, 0.0) for split in df["stage_s"]) / decode for stage in STAGES}


def forward_efficiency(summary: pd.DataFrame, base: pd.Series) -> tuple[pd.Series, pd.Series]:
    """What decoder bookkeeping costs, from the run itself.

    forward_cost: a decoder's model time per forward over the baseline's (for an AR baseline, the
    cost of its window forward in one-token forwards, on the contexts it actually decoded, interleaved
    with the baseline's). A decoder taking S forwards can then at best be step_compression /
    forward_cost faster than the baseline, so efficiency = latency_speedup / that. It reduces to
    the decoder's share of wall time spent in the model over the baseline's. Model time is the
    adapter's forward call, so what an adapter prepares inside it (a custom mask) counts as model."""
    per_forward = summary["model_s"] / summary["n_forward"]
    forward_cost = per_forward / (base["model_s"] / base["n_forward"])
    allowed = base["model_s"] / summary["model_s"]  # = (baseline's forwards / decoder's) / forward_cost
    return forward_cost, summary["latency_speedup"] / allowed


def write_summary(summary: pd.DataFrame, run_dir: Path) -> None:
    summary.to_csv(run_dir / "summary.csv", index=False)
    (run_dir / "summary.json").write_text(json.dumps(summary.to_dict(orient="records"), indent=2))


def append_results_row(summary: pd.DataFrame, results_csv: Path, run_dir: Path) -> None:
    """Append this run's rows to the runs table `results_csv` (columns are unioned)."""
    rows = summary.assign(run_dir=str(run_dir))
    if results_csv.is_file():
        rows = pd.concat([pd.read_csv(results_csv), rows], ignore_index=True)
    results_csv.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(results_csv, index=False)


def make_grid(run_dir: Path, decoders: list[str], prompt_ids: list[str], scale: int = 2) -> Path:
    """grid.png: one row per decoder, one column per prompt (the same prompts in every row)."""
    tiles = [[Image.open(run_dir / "images" / d / f"{p}.png").convert("RGB") for p in prompt_ids] for d in decoders]
    w, h = tiles[0][0].width * scale, tiles[0][0].height * scale
    label_w, pad = 64, 4
    grid = Image.new("RGB", (label_w + len(prompt_ids) * (w + pad), len(decoders) * (h + pad)), "white")
    draw = ImageDraw.Draw(grid)
    for r, (decoder, row) in enumerate(zip(decoders, tiles)):
        draw.text((4, r * (h + pad) + h // 2 - 6), decoder, fill="black")
        for c, tile in enumerate(row):
            grid.paste(tile.resize((w, h), Image.NEAREST), (label_w + c * (w + pad), r * (h + pad)))
    out = run_dir / "grid.png"
    grid.save(out)
    return out


def markdown_table(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """A GitHub markdown table (pandas' to_markdown needs the extra `tabulate` package)."""

    def cell(v) -> str:
        return format(v, floatfmt) if isinstance(v, float) else str(v)

    head = "| " + " | ".join(df.columns) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])
