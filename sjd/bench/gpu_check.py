"""The device check: one prepared command that makes a short loan of a GPU count.

    python scripts/gpu_check.py [--out results/gpu] [--deadline-s 420] [--stages device,attention,...]
    python scripts/gpu_check.py --tiny --device cpu     # the same code on tiny configs (the suite runs it)

Stages, most valuable first; each prints one JSON line (`stage`, `status`: ok, skipped with a `reason`, or failed
with the `error`; `seconds`; and its figures) as soon as it ends, and a stage that cannot finish before the
deadline (its rough cost, `COST_S`, against the time left) is skipped, so a run cut short keeps what it measured:

- `device`: the device, its clocks, the bandwidth a large copy reaches, and the matrix-vector times of Lumina-mGPT-
  7B's layer shapes at 2, 32 and 128 rows (sjd.bench.device_probe);
- `attention`: one layer's attention at windows 1, 16 and 64 at short and long context, over every slot of the
  static cache against over the live prefix;
- `engine`: the real-size Lumina-mGPT-7B (random weights, cut to `--engine-layers` layers at full width so that
  it compiles in time) at windows 1, 16, 64 and contexts of about 200 and 2,300, eager and compiled: ms against
  the floor F, compile seconds, kernels a forward, graph breaks, recompiles after the warm-up, CUDA-graph skips,
  inputs written in place without a static address, cache reallocations (sjd.bench.engine_probe). Any of those
  on the compiled engine fails the stage;
- `run`: `python run.py` as a user types it (AR and SJD on the 768 px calibrated stand-in, `device=... cache=static
  compile=true compile_strict=true`, and a real-size shadow where the `shadow` config group has one): ms a token,
  ms an iteration, syncs an iteration, and tokens against the eager engine's;
- `decoders`: `experiment=gpu_decoders` (the references, our window-64 candidates and EAGLE) on the eager and the
  compiled engine, and shadow-timed where a shadow exists, with the time left; its rows go to `--out` beside the
  cost model's prediction for the same decodes.

`--tiny` keeps every stage and shrinks it: tiny widths and contexts, one width in the engine stage (inductor
compiles it, as on a GPU), the toy model instead of the stand-in and one prompt, `run.py`'s compiled run on dynamo's
`eager` backend (the same graphs, breaks and recompiles, without inductor's code generation, which takes minutes on
a CPU), and the decoders on the eager engine only, so the suite runs the whole check on the CPU (the times mean
nothing there; the invariants do).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from sjd.bench import device_probe, engine_probe
from sjd.bench.real_models import ROOT, build
from sjd.models.loading import torch_dtype

STAGES = ("device", "attention", "engine", "run", "decoders")
COST_S = {  # rough seconds a stage needs on a GPU at full size (the tiny check: TINY_COST_S)
    "device": 30,
    "attention": 30,
    "engine": 240,
    "run": 150,
    "decoders": 90,
}
TINY_COST_S = dict.fromkeys(STAGES, 1)
ENGINE_FAILS = ("graph_breaks", "recompiles_after_warmup", "cudagraph_skips", "mutated_non_static_inputs",
                "cache_reallocations")  # fmt: skip


@dataclass
class Check:
    """One run of the check: where it runs, how big, until when, and what earlier stages found."""

    device: torch.device
    tiny: bool
    deadline_s: float
    out: Path | None
    engine_layers: int | None
    python: str = sys.executable
    started: float = field(default_factory=time.perf_counter)
    found: dict = field(default_factory=dict)  # stage -> its figures, for the stages after it

    def left_s(self) -> float:
        return self.deadline_s - (time.perf_counter() - self.started)

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype("auto", self.device)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def repeats(self, full: int) -> int:
        return 3 if self.tiny else full


def run_stage(check: Check, name: str, fn: Callable[[Check], dict], emit: Callable[[dict], None]) -> dict:
    """Run one stage under the deadline and emit its JSON line; a failure is reported, never raised."""
    cost = (TINY_COST_S if check.tiny else COST_S)[name]
    if check.left_s() < cost:
        reason = f"needs about {cost} s; {max(0.0, check.left_s()):.0f} s left before the deadline"
        line = {"stage": name, "status": "skipped", "seconds": 0.0, "reason": reason}
        emit(line)
        return line
    t0 = time.perf_counter()
    try:
        figures = fn(check)
        status = figures.pop("status", "ok")
        line = {"stage": name, "status": status, "seconds": round(time.perf_counter() - t0, 1), **figures}
        check.found[name] = figures
    except Exception as e:  # a stage that fails must not stop the others: its error is its line
        line = {"stage": name, "status": "failed", "seconds": round(time.perf_counter() - t0, 1),
                "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc(limit=6)[-2000:]}  # fmt: skip
    finally:
        gc.collect()
        if check.device.type == "cuda":
            torch.cuda.empty_cache()
    emit(line)
    return line


# -- stages --------------------------------------------------------------------------------------------------
def shapes(check: Check) -> device_probe.LayerShapes:
    """Lumina-mGPT-7B's layer shapes (tiny: the tiny config's)."""
    from transformers import ChameleonConfig

    from sjd.models.real_architectures import TINY

    config = ChameleonConfig(**dict(TINY, num_key_value_heads=4)) if check.tiny else ChameleonConfig()
    return device_probe.LayerShapes.of(config, code_rows=8192)


def stage_device(check: Check) -> dict:
    rows = [2, 32, 128]
    copy = device_probe.copy_bandwidth(check.device, 16 if check.tiny else 2048, check.repeats(20))
    return {
        **device_probe.describe(check.device),
        **copy,
        "matvec": device_probe.matvec_times(check.device, check.dtype, shapes(check), rows, check.repeats(20)),
    }


def stage_attention(check: Check) -> dict:
    slots = 96 if check.tiny else 2678  # the 768 px static cache: 64 prompt slots, 2,357 positions, 256 scratch, 1
    contexts = [16, 64] if check.tiny else [200, 2300]
    return {"attention": device_probe.attention_times(
        check.device, check.dtype, shapes(check), slots, contexts, [1, 16, 64] if not check.tiny else [1, 16],
        check.repeats(20),
    )}  # fmt: skip


def bandwidth_gbs(check: Check) -> tuple[float, str]:
    """The bandwidth F is priced at: the datasheet's where the device has one, else what the copy reached."""
    sheet = device_probe.datasheet(check.device)
    if sheet:
        return sheet["bandwidth_gbs"], f"datasheet ({sheet['key']})"
    measured = check.found.get("device", {}).get("bandwidth_gbs")
    if measured:
        return float(measured), "measured copy"
    return float(device_probe.copy_bandwidth(check.device, 16, 3)["bandwidth_gbs"]), "measured copy"


def stage_engine(check: Check) -> dict:
    built = build("lumina", check.tiny, check.device, check.dtype, layers=check.engine_layers)
    adapter = built.adapter
    layer_shapes = device_probe.LayerShapes.of(adapter.model.config, len(adapter.layout.free_token_ids))
    layers = adapter.architecture()["num_hidden_layers"]
    arch = engine_probe.architecture(layer_shapes, layers)
    bandwidth, source = bandwidth_gbs(check)
    contexts = [40, 60] if check.tiny else [200, 2300]
    windows = [4] if check.tiny else [1, 16, 64]  # tiny: one width, one graph for inductor to compile
    mode = "reduce-overhead" if check.device.type == "cuda" else None
    engines = {}
    for name, compiled in (("eager", False), ("compiled", True)):
        engines[name] = engine_probe.engine_forwards(adapter, compiled, mode, contexts, windows, check.repeats(10))
        for row in engines[name]["forwards"]:
            floor = engine_probe.floor_ms(arch, 2, 1, row["context"], check.dtype_name, bandwidth)
            row["floor_ms"] = round(floor, 4)
            row["over_floor"] = round(row["ms"] / floor, 2)
    compiled = engines["compiled"]
    bad = {k: compiled[k] for k in ENGINE_FAILS if compiled.get(k)}
    return {
        "status": "failed" if bad else "ok",
        **({"error": f"the compiled engine fell short: {bad}"} if bad else {}),
        "model": "lumina", "layers": layers, "params_b": round(built.params / 1e9, 3), "dtype": check.dtype_name,
        "floor_bandwidth_gbs": bandwidth, "floor_source": source,
        **{k: compiled[k] for k in (*ENGINE_FAILS, "cache_moved")}, "syncs_per_iteration": None,
        "engines": engines,
    }  # fmt: skip


def run_command(check: Check, args: list[str], out_csv: Path, run_dir: Path) -> tuple[list[str], float, int, str]:
    """`python run.py ARGS` as a user types it (with where its rows and run directory go), under the deadline."""
    command = [check.python, "run.py", *args, f"results_csv={out_csv}", f"hydra.run.dir={run_dir}"]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, check.left_s()))
        code, tail = done.returncode, (done.stdout + done.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        code, tail = -1, "stopped at the deadline"
    return command[1:], round(time.perf_counter() - t0, 1), code, tail


def decode_rows(run_dir: Path, engine: str) -> list[dict]:
    """Per decoder of a run: ms a token, ms an iteration (a forward after the prefill), forwards, and its measured
    latency speedup over AR beside the cost model's for the same decodes on the engine that matches the run's
    (`eager`, else the default graphed one), and measured over modelled."""
    samples = pd.read_json(run_dir / "samples.jsonl", lines=True)
    summary = pd.read_csv(run_dir / "summary.csv").set_index("decoder")
    modelled = "modelled_eager_speedup" if engine == "eager" else "modelled_speedup"
    rows = []
    for decoder, df in samples.groupby("decoder", sort=False):
        decode_ms = 1000 * df["decode_s"].sum()
        row = summary.loc[decoder] if decoder in summary.index else pd.Series(dtype=float)
        measured, model = row.get("latency_speedup", float("nan")), row.get(modelled, float("nan"))
        rows.append({"decoder": decoder, "images": len(df),
                     "ms_per_token": round(decode_ms / df["n_tokens"].sum(), 4),
                     "ms_per_iteration": round(decode_ms / max(1, (df["n_forward"] - 1).sum()), 4),
                     "forwards_per_image": float(df["n_forward"].mean()),
                     "measured_speedup": round(float(measured), 3), modelled: round(float(model), 3),
                     "measured_over_modelled": round(float(measured / model), 3)})  # fmt: skip
    return rows


def tokens_of(run_dir: Path) -> dict:
    samples = pd.read_json(run_dir / "samples.jsonl", lines=True)
    return {(r.decoder, r.prompt_id): list(r.tokens) for r in samples.itertuples()}


def shadow_available() -> bool:
    return (ROOT / "conf" / "shadow" / "lumina.yaml").exists()


def user_runs(check: Check, base: list[str], label: str) -> dict:
    """`base` on the compiled engine (strict), the eager engine on the same static cache, and (at full size, where
    one exists) shadow-timed by the real-size Lumina-mGPT-7B; each run's decoders, and compiled tokens against
    eager ones."""
    device = ["device=" + check.device.type]
    compiled_args = [*base, *device, "cache=static", "compile=true", "compile_strict=true"]
    if check.tiny:  # dynamo's graphs, breaks and recompiles as on a GPU, without inductor's minutes of codegen
        compiled_args.append("compile_backend=eager")
    runs = {"compiled": compiled_args, "eager": [*base, *device, "cache=static", "compile=false"]}
    if check.tiny and label == "decoders":  # the compiled path is the `run` stage's; here the decoders, eagerly
        runs.pop("compiled")
    if shadow_available() and not check.tiny:
        runs["compiled_shadow"] = [*compiled_args, "shadow=lumina"]
    out_csv = (check.out or Path(tempfile.mkdtemp())) / f"gpu_{label}.csv"
    found, dirs = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in runs.items():
            dirs[name] = Path(tmp) / name
            command, seconds, code, tail = run_command(check, args, out_csv, dirs[name])
            found[name] = {"command": " ".join(["python", *command[:-2]]), "seconds": seconds, "returncode": code}
            if code != 0:
                found[name]["error"] = tail
                continue
            found[name]["decoders"] = decode_rows(dirs[name], "eager" if name == "eager" else "compiled")
        if "compiled" in found and all(found[k]["returncode"] == 0 for k in ("compiled", "eager")):
            compiled, eager = tokens_of(dirs["compiled"]), tokens_of(dirs["eager"])
            same = [compiled[k] == eager.get(k) for k in compiled]
            found["tokens_equal_to_eager"] = f"{sum(same)} of {len(same)} images"
    failed = [k for k, v in found.items() if isinstance(v, dict) and v.get("returncode")]
    if failed:
        found["status"] = "failed"
        found["error"] = f"runs that did not finish: {failed}"
    found["rows_csv"] = str(out_csv) if check.out else None
    return found


def syncs_per_iteration(check: Check, model: str, names: list[str]) -> dict:
    """Host syncs an iteration of each decoder on the compiled static-cache engine: on a GPU every sync torch's
    sync debug mode reports, on the CPU the sync counter's count (sjd.bench.syncs)."""
    from sjd.bench.bookkeeping import build_model, decoder_configs, entrants, model_config, prompt_batches
    from sjd.bench.syncs import count_decode, report_row
    from sjd.core.seeding import make_generators

    adapter, sampling = build_model(model, device=str(check.device))
    adapter.use_cache("static")
    (group,) = prompt_batches(model, 1, 1)
    prompts = [p for p, _ in group]
    out = {}
    for entrant in entrants(decoder_configs(names), adapter, [16], lambda _: None, model_config(model)):
        name, decoder = entrant.name, entrant.decoder

        def decode(decoder=decoder):
            gens = make_generators(0, [p.prompt_id for p in prompts], adapter.device)
            with torch.no_grad():
                return decoder.generate(adapter, prompts, sampling, gens)

        if check.device.type == "cuda":
            decode()  # the warm-up: allocator and first calls
            torch.cuda.synchronize(check.device)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    result = decode()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            iterations = max(1, max(result.n_forward) - 1)
            syncs = sum("synchroniz" in str(w.message) for w in caught)
            out[name] = round(syncs / iterations, 3)
        else:
            counts = count_decode(decode, adapter, decoder.networks(adapter))
            out[name] = round(report_row([counts])["syncs_per_iter"], 3)
    return out


def stage_run(check: Check) -> dict:
    model = "toy" if check.tiny else "standin_lumina_768_cal"
    prompts = "toy" if check.tiny else "standin"
    n = 1 if check.tiny else 2
    base = [f"model={model}", f"prompts={prompts}", f"prompts.n={n}", "decoder=sjd", "eval=none", "save_images=false"]
    found = user_runs(check, base, "run")
    found["syncs_per_iteration"] = syncs_per_iteration(check, model, ["ar", "sjd"])
    return found


def stage_decoders(check: Check) -> dict:
    base = ["experiment=gpu_decoders"]
    if check.tiny:
        base += ["model=toy", "prompts=toy", "prompts.n=1"]
    return user_runs(check, base, "decoders")


STAGE_FUNCTIONS = {"device": stage_device, "attention": stage_attention, "engine": stage_engine,
                   "run": stage_run, "decoders": stage_decoders}  # fmt: skip


# -- the command -----------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny configs: the same stages in a minute or two")
    ap.add_argument("--deadline-s", type=float, default=420.0, help="skip a stage that cannot end before this")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    ap.add_argument("--engine-layers", type=int, default=8, help="the engine stage's depth (full width); 0: all")
    ap.add_argument("--out", type=Path, default=None, help="write gpu_check.jsonl and the runs' rows here")
    args = ap.parse_args(argv)
    args.stages = args.stages.split(",")
    unknown = sorted(set(args.stages) - set(STAGES))
    if unknown:
        ap.error(f"--stages: unknown {unknown}; choose from {','.join(STAGES)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch {torch.__version__} sees no CUDA device here")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the check's stages in order, printing (and with `--out`, appending to gpu_check.jsonl) one JSON line
    each. Returns the lines."""
    args = parse_args(argv)
    layers = None if args.tiny else (args.engine_layers or None)  # tiny: the tiny config's own depth
    check = Check(torch.device(args.device), args.tiny, args.deadline_s, args.out, layers)
    if args.tiny and check.device.type == "cpu":  # one thread, here and in the runs it starts: two cores, no spinning
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    lines = []

    def emit(line: dict) -> None:
        text = json.dumps(line, default=str)
        print(text, flush=True)
        if args.out is not None:
            with open(args.out / "gpu_check.jsonl", "a") as f:
                f.write(text + "\n")
        lines.append(line)

    emit({"stage": "start", "status": "ok", "seconds": 0.0, "device": args.device, "tiny": args.tiny,
          "deadline_s": args.deadline_s, "stages": args.stages, "engine_layers": args.engine_layers,
          "git_hash": git_hash(), "python": shutil.which("python") or sys.executable})  # fmt: skip
    for name in args.stages:
        run_stage(check, name, STAGE_FUNCTIONS[name], emit)
    return lines


def git_hash() -> str:
    from sjd.harness.provenance import git_hash as head

    return head()
