"""The GPU smoke check (scripts/gpu_smoke.py): every real architecture at its real size, random weights, through our
adapters.

    python scripts/gpu_smoke.py [--models lumina,anole,emu3,janus,llamagen] [--out results/gpu_forward_latency.csv]
    python scripts/gpu_smoke.py --device cpu --tiny --out /tmp/gpu_smoke_tiny.csv   # the same code, tiny widths

Not part of CI and no test depends on it. For each model the script builds the real configuration (Lumina-mGPT 7B
and Anole 7B = Chameleon-7B, Emu3-Gen 8B, Janus-Pro 7B, LlamaGen-XL 775M) directly on the device in the run dtype
with transformers' (or our GPT's) random init, so nothing is downloaded and building takes seconds. The prompt
encoders are offline character tokenizers, the vocabulary maps carry the real token counts and the layouts are the
real ones (Lumina 768 px: 48 x 49 + 5 = 2357 tokens; Anole 1026; Emu3 8193; Janus 576; LlamaGen 1024). LlamaGen's
T5 encoder is a one-layer random stand-in of flan-t5-xl's width: only the GPT is timed.

Per model, batch 1 with CFG (two cache rows, as the decoders run):
- syncs: host syncs per iteration of AR's and SJD's eager loops, counted on the device (sjd/bench/syncs.py).
- decode: AR and SJD (window 16) through the real decoders on each engine of `--engines` (eager on the dynamic
  cache; compiled on the static cache for the models of `--compile-models`, reduce-overhead on CUDA, each
  width compiled in an untimed warm-up decode; `vs_eager` is the engine's speedup per token over eager), on
  the first `--decode-tokens` positions of the real layout (the adapter's layout cut to that prefix), with the
  model's sampling settings from conf/model/*.yaml.
  Random weights make SJD's acceptance meaningless; the rows show the loop's cost per forward and per token.
- forward: the adapter protocol at a fixed context. `--context` generated tokens are written first (in chunks),
  then `forward(W tokens, start=context)` + `truncate([context])` is timed for every W in `--windows`
  (CUDA events, warm-up excluded, median of `--repeats`). The context is capped at n_tokens - max(W) of the
  model's layout: a decoder never attends to more than its own image (the cap is printed and recorded).

One CSV row per (model, measure, window); a model that fails (e.g. out of memory) gets one row with the error and
the next model runs. Rows are written after every model, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.metadata
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

from sjd.bench.real_models import MODELS, PROMPT, ROOT, build, sampling_for
from sjd.bench.syncs import count_decode, report_row
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.provenance import git_hash
from sjd.harness.results import markdown_table
from sjd.models.base import ModelAdapter
from sjd.models.loading import torch_dtype
from sjd.types import ImageLayout

WRITE_CHUNK = 256  # tokens per forward when writing the context (bounds the logits' memory)


# -- measuring -----------------------------------------------------------------------------------------------
def timed_ms(device: torch.device, fn: Callable, *args) -> float:
    """Wall time of one call as the device sees it: CUDA events on an idle GPU (so host work inside the call,
    e.g. building the cache mask, counts), perf_counter on the CPU."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn(*args)
        return (time.perf_counter() - t0) * 1000
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def random_stream(layout: ImageLayout, n: int, seed: int = 0) -> torch.Tensor:
    """[1, n] ids that obey the layout's grammar: forced tokens where forced, random free ids elsewhere."""
    g = torch.Generator().manual_seed(seed)
    free = layout.free_token_ids
    ids = free[torch.randint(len(free), (n,), generator=g)]
    forced = layout.forced[:n]
    return torch.where(forced >= 0, forced, ids)[None]


def forward_latencies(
    adapter: ModelAdapter, context: int, windows: list[int], warmup: int, repeats: int
) -> dict[int, float]:
    """Median ms of forward(W tokens at start=context) + truncate, per window W, batch 1 with CFG."""
    stream = random_stream(adapter.layout, context + max(windows)).to(adapter.device)
    adapter.prefill([PROMPT], with_uncond=True)
    for s in range(0, context, WRITE_CHUNK):
        adapter.forward(stream[:, s : min(s + WRITE_CHUNK, context)], [s])
    medians = {}
    for w in windows:
        tokens, times = stream[:, context : context + w], []
        for i in range(warmup + repeats):
            ms = timed_ms(adapter.device, adapter.forward, tokens, [context])
            adapter.truncate([context])
            if i >= warmup:
                times.append(ms)
        medians[w] = statistics.median(times)
    return medians


def prefix_layout(layout: ImageLayout, n: int) -> ImageLayout:
    """The first n positions of a layout: decoders then stop after n tokens (the cache is what a full run has)."""
    n = min(n, layout.n_tokens)
    return dataclasses.replace(layout, n_tokens=n, height=max(1, n // layout.row_stride), forced=layout.forced[:n])


def decode(adapter: ModelAdapter, decoder, sampling: SamplingConfig, n: int) -> dict:
    full = adapter.layout
    adapter.layout = prefix_layout(full, n)
    try:
        gens = make_generators(0, [PROMPT.prompt_id], adapter.device)
        result = decoder.generate(adapter, [PROMPT], sampling, gens)
    finally:
        adapter.layout = full
    n, forwards = result.tokens.shape[1], result.n_forward[0]
    ms = result.decode_s * 1000
    return {
        "tokens": n,
        "n_forward": forwards,
        "decode_ms": ms,
        "ms_per_token": ms / n,
        "ms_per_forward": ms / forwards,
    }


def measure_model(name: str, args, device: torch.device, dtype: torch.dtype, rows: list[dict]) -> None:
    """Append the model's decode and forward rows to `rows` as they are measured (a failure keeps the earlier ones)."""
    built = build(name, args.tiny, device, dtype)
    adapter, layout = built.adapter, built.adapter.layout
    base = {"model": name, "params_b": round(built.params / 1e9, 3), "layout_tokens": layout.n_tokens}
    note = "; ".join(x for x in [built.note, "random weights" + (", tiny widths" if args.tiny else "")] if x)
    print(f"  built {name}: {base['params_b']} B timed parameters, layout {layout.n_tokens} tokens", flush=True)
    context = min(args.context, layout.n_tokens - max(args.windows))
    if context < 1:
        raise ValueError(f"{name}: its {layout.n_tokens} layout tokens leave no context for window {max(args.windows)}")

    sampling = sampling_for(name)
    decoders = [ARDecoder(), SJDDecoder(name=f"sjd{args.sjd_window}", window=args.sjd_window)]
    for d in decoders:  # host syncs per iteration of the eager loop, on the device (sjd/bench/syncs.py)
        counts = count_decode(lambda d=d: decode(adapter, d, sampling, min(48, args.decode_tokens)), adapter, {})
        rows.append({**base, "measure": f"syncs_{d.name}", **report_row([counts]), "note": note})
    engines = [e for e in args.engines if e == "eager_dynamic" or name in args.compile_models]
    eager_ms: dict[str, float] = {}
    for engine in engines:  # AR and SJD on each engine: the baseline always on the decoder's
        adapter.uncompile()
        adapter.use_cache("dynamic")
        if engine == "compiled_static":
            adapter.compile_windows("reduce-overhead" if device.type == "cuda" else None)
        started = time.perf_counter()
        for d in decoders:  # warm-up: kernels, allocator, the sampling path's tables, every window width compiled
            decode(adapter, d, sampling, args.decode_tokens)
        warm_s = time.perf_counter() - started
        for d in decoders:
            stats = decode(adapter, d, sampling, args.decode_tokens)
            eager_ms.setdefault(d.name, stats["ms_per_token"])
            rows.append({**base, "measure": f"decode_{d.name}", "engine": engine, **stats, "warmup_s": warm_s,
                         "vs_eager": eager_ms[d.name] / stats["ms_per_token"],
                         "note": f"{note}; acceptance of random weights is not meaningful"})  # fmt: skip
    adapter.uncompile()
    adapter.use_cache("dynamic")

    if context < args.context:
        print(f"  context capped at {context} = {layout.n_tokens} layout tokens - window {max(args.windows)}")
    medians = forward_latencies(adapter, context, args.windows, args.warmup, args.repeats)
    for w, ms in medians.items():
        rows.append({**base, "measure": "forward", "context": context, "window": w, "repeats": args.repeats,
                     "median_ms": ms, "ratio_vs_window1": ms / medians[args.windows[0]], "note": note})  # fmt: skip


def environment(device: torch.device, dtype: torch.dtype) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {"dtype": str(dtype).removeprefix("torch."), "device_name": name, "torch": torch.__version__,
            "transformers": importlib.metadata.version("transformers"), "git": git_hash()}  # fmt: skip


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


COLUMNS = ["model", "params_b", "dtype", "measure", "engine", "context", "window", "repeats", "median_ms",
           "ratio_vs_window1", "tokens", "n_forward", "decode_ms", "ms_per_token", "ms_per_forward", "vs_eager",
           "warmup_s", "decoder_syncs_per_iter", "forward_syncs_per_iter", "layout_tokens", "peak_gb", "model_s",
           "device_name", "torch", "transformers", "git", "note", "error"]  # fmt: skip
SHOWN = ["model", "params_b", "measure", "engine", "context", "window", "median_ms", "ratio_vs_window1", "tokens",
         "n_forward", "ms_per_token", "vs_eager", "decoder_syncs_per_iter", "peak_gb", "error"]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                    help="auto: bfloat16 on GPU, float32 on CPU (the adapters' own default)")  # fmt: skip
    ap.add_argument("--tiny", action="store_true", help="tiny widths and depths, real vocabularies and layouts")
    ap.add_argument("--context", type=int, help="generated tokens before the timed window (default 2400; tiny 256)")
    ap.add_argument("--windows", default="1,16,32,64", help="forward widths to time, the first is the reference")
    ap.add_argument("--decode-tokens", type=int, help="tokens AR and SJD decode (default 200; tiny 48)")
    ap.add_argument("--sjd-window", type=int, default=16)
    ap.add_argument(
        "--engines",
        default="eager_dynamic,compiled_static",
        help="decode engines: eager_dynamic and compiled_static (cache=static, compile=true)",
    )
    ap.add_argument(
        "--compile-models",
        default="lumina",
        help="models decoded compiled too (compiling every width of a 7B model takes minutes)",
    )
    ap.add_argument("--repeats", type=int, help="timed forwards per window (default 10; tiny 3)")
    ap.add_argument("--warmup", type=int, help="untimed forwards per window first (default 3; tiny 1)")
    ap.add_argument("--max-seconds", type=float, default=420.0, help="skip the remaining models after this long")
    ap.add_argument("--out", type=Path, help="CSV (default results/gpu_forward_latency.csv; tiny: ..._tiny.csv)")
    args = ap.parse_args(argv)
    defaults = dict(context=256, decode_tokens=48, repeats=3, warmup=1) if args.tiny else {}
    defaults = {"context": 2400, "decode_tokens": 200, "repeats": 10, "warmup": 3, **defaults}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    suffix = "_tiny" if args.tiny else ""
    args.out = args.out or ROOT / "results" / f"gpu_forward_latency{suffix}.csv"
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        ap.error(f"--models: unknown {unknown}; choose from {','.join(MODELS)}")
    args.windows = [int(w) for w in args.windows.split(",")]
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    args.compile_models = [m.strip() for m in args.compile_models.split(",") if m.strip()]
    if set(args.engines) - {"eager_dynamic", "compiled_static"}:
        ap.error("--engines: eager_dynamic and/or compiled_static")
    if min(args.windows) < 1 or args.repeats < 1 or args.warmup < 0 or args.decode_tokens < 1:
        ap.error("--windows, --repeats and --decode-tokens must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device visible (use --device cpu --tiny for the CPU check)")
    dtype = torch_dtype(args.dtype, device)
    env = environment(device, dtype)
    print(
        f"{env['device_name']}, {env['dtype']}, torch {env['torch']}, transformers {env['transformers']}, "
        f"git {env['git']}; context {args.context}, windows {args.windows}, batch 1 with CFG",
        flush=True,
    )
    t_start, rows = time.perf_counter(), []
    for name in args.models:
        if time.perf_counter() - t_start > args.max_seconds:
            rows.append({"model": name, "error": f"skipped: --max-seconds {args.max_seconds:g} spent"})
            print(f"{name}: skipped (--max-seconds {args.max_seconds:g} spent)")
            continue
        print(f"{name}:", flush=True)
        t0 = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        got: list[dict] = []
        try:
            measure_model(name, args, device, dtype, got)
        except Exception as err:  # an OOM or a broken adapter: record it, go on with the next model
            traceback.print_exc()
            got.append({"model": name, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"})
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
        seconds = time.perf_counter() - t0
        rows += [{**r, "peak_gb": peak, "model_s": seconds} for r in got]
        free_memory(device)
        print(f"  {name}: {seconds:.1f} s", flush=True)
        write(rows, env, args.out)
    write(rows, env, args.out)
    print(f"total {time.perf_counter() - t_start:.1f} s; wrote {args.out}")
    print(markdown_table(shown(rows), floatfmt=".2f"))


INT_COLUMNS = ("context", "window", "repeats", "tokens", "n_forward", "layout_tokens")


def frame(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    """Rows as a table of `columns`, counts as integers (blank, not NaN-float, where a measure has none)."""
    table = pd.DataFrame(rows).reindex(columns=columns)
    for col in INT_COLUMNS:
        if col in table:
            table[col] = table[col].astype("Int64")
    return table


def shown(rows: list[dict]) -> pd.DataFrame:
    table = frame(rows, SHOWN)
    return table.astype(object).where(table.notna(), "")


def write(rows: list[dict], env: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    frame([{**env, **r} for r in rows], COLUMNS).to_csv(out, index=False)
