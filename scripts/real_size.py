"""Do the real shapes fit and run? Each 7B-class architecture at its real size, bf16, random weights, on this CPU.

    python scripts/real_size.py [--models lumina,janus,emu3] [--windows 3] [--out results/real_size.csv]
    python scripts/real_size.py --tiny --models lumina --out /tmp/real_size_tiny.csv   # the same code, tiny widths

A study of memory and shapes, not of speed or acceptance (random weights accept nothing meaningful). For each
model, in a child process of its own so that its peak memory is its own:
- build the real configuration in the dtype (bfloat16) with random weights (sjd/models/real_architectures.py:
  Lumina-mGPT 7B at 768 px, Janus-Pro 7B, Emu3-Gen 8B; Anole 7B and LlamaGen-XL on request);
- decode one prompt, batch 1 with its CFG row, with SJD as conf/decoder/sjd.yaml ships it and the model's own
  sampling settings, through the real adapter on the static KV cache sized to the real layout: the prefill,
  then the first `--windows` windows (the decoder stops there);
- record the weights' and the cache's bytes, the cache tensor's shape, every forward that went through the adapter
  (input and logits shapes, seconds), the resident memory after building, after the prefill and at the end, and
  the peak resident memory of the process (VmHWM).
One CSV row per (model, forward), the model's totals repeated on each; a model that fails (out of memory, a shape
error) gets one row with the error, and the next model runs. Rows are written after every model.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import shlex
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


def child(args: argparse.Namespace) -> None:
    """One model in this process: its facts as JSON to --child-out."""
    torch.set_num_threads(args.threads or torch.get_num_threads())
    facts = measure(args.child, args.tiny, args.windows)
    Path(args.child_out).write_text(json.dumps(facts))


def run_child(name: str, args: argparse.Namespace) -> list[dict]:
    """Measure one model in a child process; its rows, or one row with what went wrong."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "facts.json"
        command = [sys.executable, __file__, "--child", name, "--child-out", str(out), "--windows", str(args.windows)]
        command += ["--tiny"] * args.tiny + (["--threads", str(args.threads)] if args.threads else [])
        proc = subprocess.run(command, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0 or not out.exists():
            last = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or [""]
            why = "killed (SIGKILL: out of memory?)" if proc.returncode == -9 else last[0][:300]
            print(proc.stderr[-3000:], file=sys.stderr)
            return [{"model": name, "error": f"exit {proc.returncode}: {why}"}]
        facts = json.loads(out.read_text())
    forwards = facts.pop("forwards")
    return [{**facts, "step": i, **f} for i, f in enumerate(forwards)]


def environment() -> dict:
    return {"dtype": "bfloat16", "device_name": platform.processor() or "cpu", "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": importlib.metadata.version("transformers"),
            "git_hash": git_hash(), "command": shlex.join(["python", *sys.argv])}  # fmt: skip


SHOWN = ["model", "params_b", "step", "forward", "tokens_in", "trunk_in", "mask", "cond_logits", "seconds",
         "weights_gb", "cache_gb", "peak_gb", "error"]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help=f"comma-separated subset of {MODELS}")
    ap.add_argument("--windows", type=int, default=3, help="SJD windows after the prefill")
    ap.add_argument("--tiny", action="store_true", help="tiny widths and depths, real vocabularies and layouts")
    ap.add_argument("--threads", type=int, help="torch threads per child (default: torch's)")
    ap.add_argument("--out", type=Path, help="CSV (default results/real_size.csv; tiny: /tmp/real_size_tiny.csv)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.windows < 1:
        ap.error("--windows must be >= 1")
    if args.child:
        return child(args)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        ap.error(f"--models: unknown {unknown}; choose from {','.join(MODELS)}")
    out = args.out or (
        Path(tempfile.gettempdir()) / "real_size_tiny.csv" if args.tiny else ROOT / "results" / "real_size.csv"
    )
    env, rows = environment(), []
    print(f"{env['device_name']}, bfloat16, {env['threads']} threads, torch {env['torch']}, git {env['git_hash']}")
    for name in models:
        started = time.perf_counter()
        print(f"{name}: building and decoding in a child process", flush=True)
        rows += [{**r, "tiny": args.tiny} for r in run_child(name, args)]
        print(f"  {name}: {time.perf_counter() - started:.0f} s", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame([{**r, **env} for r in rows]).to_csv(out, index=False)
    table = pd.DataFrame(rows).reindex(columns=SHOWN)
    print(markdown_table(table.astype(object).where(table.notna(), ""), floatfmt=".2f"))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
