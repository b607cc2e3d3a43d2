"""Do the real shapes fit and run? Each 7B-class architecture at its real size, bf16, random weights, on this CPU;
`scripts/real_size.py` is its command line.

A study of memory and shapes, not of speed or acceptance (random weights accept nothing meaningful). For each
model, in a child process of its own so that its peak memory is its own:
- build the real configuration in the dtype (bfloat16) with random weights (sjd/models/real_architectures.py:
  Lumina-mGPT 7B at 768 px, Janus-Pro 7B, Emu3-Gen 8B; Anole 7B and LlamaGen-XL on request);
- decode one prompt, batch 1 with its CFG row, with SJD as conf/decoder/sjd.yaml ships it and the model's own
  sampling settings, through the real adapter on the static KV cache sized to the real layout: the prefill,
  then the first `windows` windows (the decoder stops there);
- record the weights' and the cache's bytes, the cache tensor's shape, every forward that went through the adapter
  (input and logits shapes, seconds), the resident memory after building, after the prefill and at the end, and
  the peak resident memory of the process (VmHWM).
One CSV row per (model, forward), the model's totals repeated on each; a model that fails (out of memory, a shape
error) gets one row with the error, and the next model runs. Rows are written after every model.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

from sjd.bench.real_models import MODELS, PROMPT, ROOT, build, sampling_for
from sjd.core.seeding import make_generators
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.provenance import git_hash
from sjd.harness.results import markdown_table
from sjd.models.base import ModelAdapter
from sjd.types import Logits

DEFAULT_MODELS = ("lumina", "janus", "emu3")


@dataclass(eq=False, kw_only=True)
class FirstWindows(SJDDecoder):
    """SJD, stopped after its first `windows` windows (what the study runs at real size: a whole image of a 7B
    model takes hours on two CPU cores, and its shapes repeat from window to window)."""

    windows: int = 3

    def begin(self, state, call) -> None:
        super().begin(state, call)
        self._iterations = 0

    def widths(self, schedule, state) -> list[int]:
        self._iterations += 1
        widths = SJDDecoder.widths(schedule, state)
        return widths if self._iterations <= self.windows else [0] * len(widths)


def memory_gb() -> dict[str, float]:
    """Resident memory now and its peak so far, of this process, from /proc (Linux)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 2**20  # kB -> GiB
    return {"rss_gb": fields["VmRSS"], "peak_gb": fields["VmHWM"]}


def shape(t: torch.Tensor | None) -> str:
    return "" if t is None else "x".join(str(n) for n in t.shape)


def recorded(adapter: ModelAdapter, forwards: list[dict]) -> None:
    """Log every prefill, forward and forward_at through the adapter: the tokens in, what reached the transformer
    trunk (its input and attention-mask shapes, every CFG row), the logits out, and the seconds."""
    trunk: list[dict] = []

    def seen(module, args, kwargs) -> None:
        tensor = kwargs.get("inputs_embeds", kwargs.get("input_ids", args[0] if args else None))
        mask = kwargs.get("attention_mask")
        trunk.append({"trunk_in": shape(tensor), "mask": shape(mask) if isinstance(mask, torch.Tensor) else ""})

    adapter.window_stack().register_forward_pre_hook(seen, with_kwargs=True)

    def wrap(kind: str, method):
        def call(*args, **kwargs):
            trunk.clear()
            started = time.perf_counter()
            out: Logits = method(*args, **kwargs)
            seconds = time.perf_counter() - started
            tokens = args[0] if kind != "prefill" else None
            forwards.append({"forward": kind, "tokens_in": shape(tokens), **(trunk[0] if trunk else {}),
                             "cond_logits": shape(out.cond), "uncond_logits": shape(out.uncond),
                             "seconds": round(seconds, 3)})  # fmt: skip
            return out

        return call

    for kind in ("prefill", "forward", "forward_at"):
        setattr(adapter, kind, wrap(kind, getattr(adapter, kind)))


def cache_facts(adapter: ModelAdapter) -> dict:
    """The static cache's layout and the bytes of its key/value tensors."""
    cache = adapter._ragged()
    layers = [layer for layer in cache.cache.layers if getattr(layer, "keys", None) is not None]
    nbytes = sum(t.numel() * t.element_size() for layer in layers for t in (layer.keys, layer.values))
    return {"cache_layers": len(layers), "cache_layer_shape": shape(layers[0].keys), "cache_gb": nbytes / 2**30,
            "cache_prompt_slots": cache.prompt_width, "cache_image_slots": cache.n_tokens,
            "cache_scratch_slots": cache.scratch}  # fmt: skip


def measure(name: str, tiny: bool, windows: int) -> dict:
    """Build one model, decode its prefill and first windows; everything the row records."""
    torch.manual_seed(0)
    dtype = torch.bfloat16
    started = time.perf_counter()
    built = build(name, tiny, torch.device("cpu"), dtype)
    adapter = built.adapter
    adapter.use_cache("static")
    modules = [m for m in vars(adapter).values() if isinstance(m, torch.nn.Module)]
    params = {id(p): p for m in modules for p in m.parameters()}  # every network the adapter holds, once
    weights = sum(p.numel() * p.element_size() for p in params.values())
    after_build = memory_gb()
    build_s = time.perf_counter() - started
    settings = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "decoder" / "sjd.yaml"))
    settings.pop("_target_")
    decoder = FirstWindows(**settings, windows=windows)
    forwards: list[dict] = []
    recorded(adapter, forwards)
    started = time.perf_counter()
    with torch.no_grad():
        result = decoder.generate(adapter, [PROMPT], sampling_for(name), make_generators(0, [PROMPT.prompt_id], "cpu"))
    decode_s = time.perf_counter() - started
    layout = adapter.layout
    return {
        "model": name, "params_b": round(built.params / 1e9, 3), "weights_gb": weights / 2**30,
        "layout_tokens": layout.n_tokens, "vocab_size": layout.vocab_size, "window": decoder.window,
        "windows": windows, "committed": sum(result.accepted[0]), "n_forward": result.n_forward[0],
        **cache_facts(adapter), "build_s": build_s, "decode_s": decode_s,
        "rss_after_build_gb": after_build["rss_gb"], "rss_end_gb": memory_gb()["rss_gb"],
        "peak_gb": memory_gb()["peak_gb"], "note": built.note, "forwards": forwards,
    }  # fmt: skip


def child(name: str, tiny: bool, windows: int, threads: int | None, out: str) -> None:
    """One model in this process: its facts as JSON to `out`."""
    torch.set_num_threads(threads or torch.get_num_threads())
    facts = measure(name, tiny, windows)
    Path(out).write_text(json.dumps(facts))


def run_child(name: str, tiny: bool, windows: int, threads: int | None) -> list[dict]:
    """Measure one model in a child process; its rows, or one row with what went wrong."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "facts.json"
        call = f"from sjd.bench.real_size import child; child({name!r}, {tiny}, {windows}, {threads}, {str(out)!r})"
        proc = subprocess.run([sys.executable, "-c", call], stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0 or not out.exists():
            last = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or [""]
            why = "killed (SIGKILL: out of memory?)" if proc.returncode == -9 else last[0][:300]
            print(proc.stderr[-3000:], file=sys.stderr)
            return [{"model": name, "error": f"exit {proc.returncode}: {why}"}]
        facts = json.loads(out.read_text())
    forwards = facts.pop("forwards")
    return [{**facts, "step": i, **f} for i, f in enumerate(forwards)]


def environment(command: str) -> dict:
    return {"dtype": "bfloat16", "device_name": platform.processor() or "cpu", "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": importlib.metadata.version("transformers"),
            "git_hash": git_hash(), "command": command}  # fmt: skip


SHOWN = ["model", "params_b", "step", "forward", "tokens_in", "trunk_in", "mask", "cond_logits", "seconds",
         "weights_gb", "cache_gb", "peak_gb", "error"]  # fmt: skip


def default_out(tiny: bool) -> Path:
    """results/real_size.csv at real size; a tiny run's CSV goes to the temporary directory, not the results."""
    return Path(tempfile.gettempdir()) / "real_size_tiny.csv" if tiny else ROOT / "results" / "real_size.csv"


def real_size(models: list[str], windows: int, tiny: bool, threads: int | None, out: Path, command: str) -> None:
    """Measure each of `models` (names of MODELS) in a child process of its own, writing the CSV to `out` after
    every model and printing the table at the end; `command` is recorded in each row."""
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise ValueError(f"models: unknown {unknown}; choose from {','.join(MODELS)}")
    if windows < 1:
        raise ValueError(f"windows must be >= 1, got {windows}")
    env, rows = environment(command), []
    print(f"{env['device_name']}, bfloat16, {env['threads']} threads, torch {env['torch']}, git {env['git_hash']}")
    for name in models:
        started = time.perf_counter()
        print(f"{name}: building and decoding in a child process", flush=True)
        rows += [{**r, "tiny": tiny} for r in run_child(name, tiny, windows, threads)]
        print(f"  {name}: {time.perf_counter() - started:.0f} s", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame([{**r, **env} for r in rows]).to_csv(out, index=False)
    table = pd.DataFrame(rows).reindex(columns=SHOWN)
    print(markdown_table(table.astype(object).where(table.notna(), ""), floatfmt=".2f"))
    print(f"wrote {out}")
