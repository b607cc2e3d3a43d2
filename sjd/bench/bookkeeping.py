"""What each decoder spends per iteration outside the model forward, as a ratio to SJD's, measured in one run.

Step compression carries over from a stand-in to a 7B model; bookkeeping does not scale the same way.
On a GPU one window forward of a 7B model costs milliseconds, so a decoder whose per-iteration work
(drafts, the logits pipeline, verification, commits, loop control) grows with the window or the branch
count can lose there what it wins in forwards, even when that work looks negligible next to a 2-layer
stand-in's forward on a CPU. This module measures that work, in the units that carry over: milliseconds
per forward, and its ratio to SJD's at the same window and batch.

Every decoder of conf/decoder/*.yaml is built from its config with Hydra's instantiate, as the runner
builds it (a decoder whose config has a `window` key, or a dynamic draft tree's `total_tokens`, gets each
window; the others are run once per batch and that measurement stands in every window's row, with `windowed`
false); a drafter decoder on a model without a shipped drafter is skipped with a message; a decoder whose
`requires` the model lacks is skipped with a message. Decoders take turns per batch of prompts in an
order that alternates from round to round, as the runner alternates them. Timing is one torch thread,
and by default the decoders' clocks read the calling thread's CPU time (`time.thread_time`) instead of
wall time, so other processes on a shared machine do not inflate one decoder's numbers more than
another's (as scripts/bench_pipeline.py times its pipeline).
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import sample_generators
from sjd.decoders.base import Decoder, DecodeResult
from sjd.decoders.stages import STAGES
from sjd.harness.decoder_configs import algorithm_configs, decoder_config
from sjd.harness.prompts import load_prompt_set
from sjd.models.base import ModelAdapter
from sjd.types import Prompt

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
BOOKKEEPING_STAGES = [s for s in STAGES if s != "forward"]
COLUMNS = [
    "decoder", "window", "windowed", "batch", "n_decodes", "iterations", "bookkeeping_ms", "bookkeeping_ratio",
    "forward_ms", "outside_model_frac", *(f"{s}_frac" for s in STAGES), *(f"{s}_ms" for s in BOOKKEEPING_STAGES),
]  # fmt: skip


@dataclass
class Entrant:
    """One decoder at one window (window None: a decoder without one, measured once per batch)."""

    name: str
    window: int | None
    decoder: Decoder


@dataclass
class Decode:
    entrant: Entrant
    batch: int
    result: DecodeResult


def decoder_configs(names: Sequence[str] | None = None) -> dict[str, DictConfig]:
    """name -> conf/decoder/<name>.yaml, every algorithm config or `names` in that order (an unknown one is named)."""
    return {n: decoder_config(n) for n in (names or algorithm_configs())}


def model_config(model: str) -> DictConfig:
    path = CONF / "model" / f"{model}.yaml"
    if not path.is_file():
        raise ValueError(f"--model {model!r}: no {path}")
    return OmegaConf.load(path)


def build_model(model: str, device: str = "cpu") -> tuple[ModelAdapter, SamplingConfig]:
    """The adapter and sampling settings of conf/model/<model>.yaml, built as the runner builds them."""
    cfg = model_config(model)
    return instantiate(cfg.adapter, device=device), SamplingConfig(**OmegaConf.to_container(cfg.sampling))


def width_key(cfg: DictConfig) -> str | None:
    """The setting that sets a decoder's forward width: `window`, or a dynamic draft tree's `total_tokens`."""
    if "window" in cfg:
        return "window"
    if "total_tokens" in cfg and cfg.get("tree") == "dynamic":
        return "total_tokens"
    return None


def entrants(
    configs: dict[str, DictConfig],
    adapter: ModelAdapter,
    windows: Sequence[int],
    say: Callable[[str], None] = print,
    model: DictConfig | None = None,
) -> list[Entrant]:
    """Every decoder the model can run, at each window where its config has one (a dynamic draft tree's
    `total_tokens` counts as its window); the others are named. Configs resolve against the `model` config,
    as in a run (a drafter decoder takes the model's shipped drafter)."""
    out = []
    for name, raw in configs.items():
        run = OmegaConf.create({"decoder": raw, "model": model if model is not None else {}})
        cfg = OmegaConf.create(OmegaConf.to_container(run.decoder, resolve=True))
        key = width_key(cfg)
        sizes = list(windows) if key else [None]
        if cfg.get("drafter") is not None and cfg.drafter.get("weights") is None:
            say(f"skipped {name}: {adapter.name!r} has no shipped drafter (model.drafter)")
            continue
        for window in sizes:
            decoder = instantiate(OmegaConf.merge(cfg, {key: window}) if window is not None else cfg)
            missing = sorted(decoder.requires - adapter.capabilities)
            if missing:
                say(f"skipped {name}: needs model capabilities {missing}, which {adapter.name!r} lacks")
                break
            decoder.check(adapter)  # as the runner does (GSD and LANTERN build their neighbour tables here)
            out.append(Entrant(name, window, decoder))
    return out


@contextmanager
def cpu_clocks() -> Iterator[None]:
    """The decoders' clocks (every `time.perf_counter` read in sjd.decoders) read this thread's CPU time."""
    shim = types.SimpleNamespace(perf_counter=time.thread_time)
    decoders = [m for n, m in list(sys.modules.items()) if n.startswith("sjd.decoders")]
    patched = [m for m in decoders if getattr(m, "time", None) is time]
    for module in patched:
        module.time = shim
    try:
        yield
    finally:
        for module in patched:
            module.time = time


def prompt_batches(model: str, n_batches: int, size: int) -> list[list[tuple[Prompt, int]]]:
    """`n_batches` batches of `size` (prompt, seed index) samples, cycling through the model's prompt set
    (conf/prompts/standin.yaml for a stand-in, else toy.yaml); a repeated caption takes the next seed index."""
    prompt_set = "standin" if model.startswith("standin") else "toy"
    cfg = OmegaConf.to_container(OmegaConf.load(CONF / "prompts" / f"{prompt_set}.yaml"))
    prompts = load_prompt_set(**(cfg | {"n": None})).prompts
    flat = [(prompts[i % len(prompts)], i // len(prompts)) for i in range(n_batches * size)]
    return [flat[i * size : (i + 1) * size] for i in range(n_batches)]


def decode_rounds(
    adapter: ModelAdapter, sampling: SamplingConfig, field: list[Entrant], batches: Sequence[int], n_batches: int,
    model: str, say: Callable[[str], None] = print, seed: int = 0,
) -> list[Decode]:  # fmt: skip
    """Warm each entrant up once (not recorded), then per batch size and prompt batch run every entrant,
    the order alternating from round to round."""

    def run(e: Entrant, group: list[tuple[Prompt, int]]) -> DecodeResult:
        gens = sample_generators(seed, [(p.prompt_id, k) for p, k in group], adapter.device)
        return e.decoder.generate(adapter, [p for p, _ in group], sampling, gens)

    for e in field:  # first use of kernels and allocator
        run(e, prompt_batches(model, 1, 1)[0])
    decodes, round_no = [], 0
    for size in batches:
        for group in prompt_batches(model, n_batches, size):
            for e in field if round_no % 2 == 0 else field[::-1]:
                decodes.append(Decode(e, size, run(e, group)))
            round_no += 1
            say(f"round {round_no}: batch {size}, {len(field)} decoder(s) x window(s) done")
    return decodes


def measure(
    model: str = "standin_lumina_512",
    decoders: Sequence[str] | None = None,
    windows: Sequence[int] = (16, 64),
    batches: Sequence[int] = (1, 8),
    n_batches: int = 2,
    cpu_time: bool = True,
    say: Callable[[str], None] = print,
) -> pd.DataFrame:
    """The bookkeeping table (`table`) of one run: every runnable decoder x window x batch size."""
    for flag, values in (("--prompts", [n_batches]), ("--windows", windows), ("--batches", batches)):
        if not values or min(values) < 1:
            raise ValueError(f"{flag} must be integers >= 1, got {list(values)}")
    adapter, sampling = build_model(model)
    field = entrants(decoder_configs(decoders), adapter, windows, say, model_config(model))
    if not any(e.name == "sjd" for e in field):
        raise ValueError("the ratios are to SJD's: include sjd in --decoders")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the calling thread does all the work, so its CPU time is the decode's
    try:
        with torch.no_grad(), cpu_clocks() if cpu_time else nullcontext():
            decodes = decode_rounds(adapter, sampling, field, batches, n_batches, model, say)
    finally:
        torch.set_num_threads(threads)
    return table(decodes, windows)


def row(decodes: list[Decode]) -> dict:
    """One entrant at one batch size: sums over its decodes, then per iteration and as fractions."""
    res = [d.result for d in decodes]
    iterations = sum(max(r.n_forward) - 1 for r in res)  # forwards of the decode loop: prefill left out
    decode_s = sum(r.decode_s for r in res)
    stage = {s: sum(r.stage_s.get(s, 0.0) for r in res) for s in STAGES}
    per_iter = 1e3 / max(iterations, 1)
    return {
        "decoder": decodes[0].entrant.name,
        "windowed": decodes[0].entrant.window is not None,
        "batch": decodes[0].batch,
        "n_decodes": len(res),
        "iterations": iterations,
        "bookkeeping_ms": (decode_s - stage["forward"]) * per_iter,
        "forward_ms": stage["forward"] * per_iter,
        "outside_model_frac": 1 - sum(r.model_s for r in res) / sum(r.latency_s for r in res),
        **{f"{s}_frac": stage[s] / decode_s for s in STAGES},
        **{f"{s}_ms": stage[s] * per_iter for s in BOOKKEEPING_STAGES},
    }


def table(decodes: list[Decode], windows: Sequence[int]) -> pd.DataFrame:
    """One row per decoder x window x batch; bookkeeping_ratio is bookkeeping_ms over SJD's at that
    window and batch (a decoder without a window repeats its one measurement in each window's row)."""
    groups: dict[tuple, list[Decode]] = {}
    for d in decodes:
        groups.setdefault((id(d.entrant), d.batch), []).append(d)
    rows = []
    for group in groups.values():
        measured = row(group)
        for window in [group[0].entrant.window] if group[0].entrant.window is not None else windows:
            rows.append(measured | {"window": window})
    out = pd.DataFrame(rows)
    sjd = out[out.decoder == "sjd"].set_index(["window", "batch"])["bookkeeping_ms"]
    out["bookkeeping_ratio"] = [ms / sjd[(w, b)] for ms, w, b in zip(out.bookkeeping_ms, out.window, out.batch)]
    first_round = list(dict.fromkeys(d.entrant.name for d in decodes))  # the decoders in their configs' order
    out["order"] = out.decoder.map(first_round.index)
    return out.sort_values(["batch", "window", "order"], kind="stable")[COLUMNS].reset_index(drop=True)
