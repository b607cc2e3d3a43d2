"""The cost model's constants fitted on our own GPU timings (a section of docs/results/cost_validation.md).

Input: results/gpu_forward_latency.csv (`scripts/gpu_smoke.sh` on an H200) and the decoders' own calls per
iteration in results/syncs.csv. The timings used are the two models whose forward's operator calls were counted
(Lumina-mGPT-7B and Anole-7B, both Chameleon-7B: sjd.core.cost.FORWARD_OPS_PER_LAYER): their eager forwards over
the windows, and their AR and SJD decodes, eager and compiled. AR's decodes and the bare forwards are fitted on;
SJD's decodes are held out (sjd.core.cost_fit). The page shows every timing's error beside the fitted constants.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sjd.core.cost import (
    ARCHITECTURES,
    COMPILED_FORWARD_S,
    EAGER_OP_S,
    EAGER_OP_S_RANGE,
    GPUS,
    PEAK_REACHED,
)
from sjd.core.cost_fit import Fit, Timing, fit_constants
from sjd.harness.pricing import counted_overheads
from sjd.harness.results import markdown_table

ROOT = Path(__file__).resolve().parents[1]
GPU_CSV = ROOT / "results" / "gpu_forward_latency.csv"
ARCHITECTURE_OF = {"lumina": "chameleon_7b", "anole": "chameleon_7b"}  # gpu_smoke's model -> sjd.core.cost's
LEFT_OUT = ("Emu3 and Janus have no architecture in sjd/core/cost.py, and LlamaGen's forward runs our own GPT, whose "
            "operator calls per forward were never counted, so their rows are not used")  # fmt: skip
GPU_OF = {"NVIDIA H200": "H200", "NVIDIA H100 80GB HBM3": "H100"}  # torch's device name -> sjd.core.cost.GPUS
# gpu_smoke's decoder -> the config of results/syncs.csv with its settings (name, window)
COUNTED_AS = {"ar": ("ar", None), "sjd16": ("sjd", 16.0)}
HELD_OUT = ("sjd16",)  # decoders the fit never sees: their decodes test it
# gpu_smoke's engine -> (sjd.core.cost's engine, the cache and kernels its decoder calls were counted with)
ENGINE_OF = {"eager_dynamic": ("eager", "dynamic", "eager"), "compiled_static": ("compiled", "static", "compiled")}


def decoder_calls(decoder: str, cache: str, kernels: str, table: pd.DataFrame | None = None) -> float:
    """Operator calls per iteration outside the forward of gpu_smoke's `decoder`, as results/syncs.csv counted its
    config at batch 1 on `cache` with `kernels`."""
    table = counted_overheads() if table is None else table
    name, window = COUNTED_AS[decoder]
    rows = table[(table["decoder"] == name) & (table["cache"] == cache) & (table["kernels"] == kernels)]
    rows = rows[rows["window"].isna()] if window is None else rows[rows["window"] == window]
    if rows.empty:
        raise ValueError(f"results/syncs.csv has no count of {name} (window {window}) on {cache} with {kernels}")
    return float(rows["ops"].iloc[0])


def gpu_timings(rows: pd.DataFrame, table: pd.DataFrame | None = None) -> list[Timing]:
    """The timings of the models in ARCHITECTURE_OF: every bare forward (batch 1 with CFG: two rows) and every
    decode's time per forward after the prefill (its decoder calls from results/syncs.csv, its syncs as counted on
    the GPU, its mean context half its tokens)."""
    rows = rows[rows["model"].isin(ARCHITECTURE_OF) & rows["error"].isna()]
    out = []
    for _, r in rows[rows["measure"] == "forward"].iterrows():
        label = f"{r['model']} forward, window {int(r['window'])}, context {int(r['context'])}"
        out.append(Timing(label, "eager", 2, int(r["window"]), float(r["context"]), r["median_ms"] / 1e3))
    for _, r in rows[rows["measure"].astype(str).str.startswith("decode_")].iterrows():
        decoder = r["measure"].removeprefix("decode_")
        engine, cache, kernels = ENGINE_OF[r["engine"]]
        counted = rows[(rows["model"] == r["model"]) & (rows["measure"] == f"syncs_{decoder}")].iloc[0]
        syncs = counted["decoder_syncs_per_iter"] + counted["forward_syncs_per_iter"]
        width = int(COUNTED_AS[decoder][1] or 1)
        per_forward = r["decode_ms"] / 1e3 / (r["n_forward"] - 1)  # decode_ms follows the prefill's forward
        out.append(Timing(f"{r['model']} {decoder} decode, {engine}", engine, 2, width, r["tokens"] / 2, per_forward,
                          decoder_calls(decoder, cache, kernels, table), syncs, decoder in HELD_OUT))  # fmt: skip
    return out


def fit_from_csv(path: Path = GPU_CSV) -> Fit:
    """The fit over results/gpu_forward_latency.csv's usable rows, on the GPU they were timed on."""
    rows = pd.read_csv(path)
    devices = set(rows.loc[rows["model"].isin(ARCHITECTURE_OF), "device_name"])
    if len(devices) != 1 or next(iter(devices)) not in GPU_OF:
        raise ValueError(f"{path}: the fitted rows must come from one GPU of {sorted(GPU_OF)}, got {sorted(devices)}")
    return fit_constants(gpu_timings(rows), ARCHITECTURES["chameleon_7b"], GPUS[GPU_OF[devices.pop()]])


def fit_table(fit: Fit) -> pd.DataFrame:
    return pd.DataFrame(
        [{"timing": label, "engine": engine, "role": "held out" if held else "fitted", "measured_ms": s * 1e3,
          "modelled_ms": m * 1e3, "error": f"{m / s - 1:+.1%}"} for label, engine, held, s, m in fit.residuals]
    )  # fmt: skip


def mean_abs(errors: list[float]) -> str:
    return f"{sum(abs(e) for e in errors) / len(errors):.1%}" if errors else "-"


def fit_section(path: Path = GPU_CSV) -> list[str]:
    """The fit's constants, the constants sjd/core/cost.py carries, and every timing's error."""
    if not path.is_file():
        return ["## The constants fitted on our GPU", "", f"Not fitted: no {path.name} in results/.", ""]
    fit = fit_from_csv(path)
    carried = {"EAGER_OP_S": (EAGER_OP_S, fit.op_s), "PEAK_REACHED": (PEAK_REACHED, fit.peak_reached),
               "COMPILED_FORWARD_S": (COMPILED_FORWARD_S, fit.forward_s)}  # fmt: skip
    constants = ", ".join(f"`{name}` = {fitted:.4g} (sjd/core/cost.py carries {value:.4g})"
                          for name, (value, fitted) in carried.items())  # fmt: skip
    lo, hi = fit.op_s_range
    return [
        "## The constants fitted on our GPU",
        "",
        "What the cost model fits, it fits on our own timings of Lumina-mGPT-7B and Anole-7B with random weights "
        "on an H200 (`results/gpu_forward_latency.csv`, page [gpu_forward_latency](gpu_forward_latency.md)), never "
        f"on a published latency; {LEFT_OUT}. The eager host time of one operator call and the share of the "
        "datasheet bf16 peak a forward's matmuls reach are fitted on the eager bare forwards (windows 1 to 64) and "
        "the eager AR decodes; the compiled engine's host time a forward on the compiled AR decode (compiled "
        "kernels, no CUDA graphs, as that run measured). SJD's decodes are held out: the fit never saw them, so "
        "their error is the model's error on a decoder it was not fitted to (sjd/core/cost_fit.py). The "
        "datasheet's bandwidth and peak stay as the datasheet states them. The graphed engine has no timing of "
        "ours: its launch cost is an assumption, carried as a range.",
        "",
        f"Fitted: {constants}. Each fitted eager timing alone implies an operator call of {lo * 1e6:.1f} to "
        f"{hi * 1e6:.1f} us (sjd/core/cost.py's range: {EAGER_OP_S_RANGE[0] * 1e6:.1f} to "
        f"{EAGER_OP_S_RANGE[1] * 1e6:.1f} us), the eager range every verdict must hold over. Mean absolute "
        f"error: {mean_abs(fit.errors(False))} on the fitted timings, {mean_abs(fit.errors(True))} on the held-out "
        "ones.",
        "",
        markdown_table(fit_table(fit), floatfmt=".2f"),
        "",
    ]
