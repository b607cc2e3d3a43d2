"""How much of a decode the logits pipeline costs, before and after free-column filtering.

    python scripts/bench_pipeline.py [--repeats 5] [--batches 1,50] [--old-batches 1] [--grids 2]
                                     [--skip-pipeline] [--skip-decode]

Prints ratios measured in this run; asserts nothing about time.

1. The pipeline alone: logits -> probabilities plus the finite check on the forward's logits, the
   implementation it replaced (kept verbatim in tests/core/test_logits_pipeline.py, loaded from there)
   against sjd.core.sampling, on an 8832-id and a 65536-id vocabulary with 8192 free image codes
   (Chameleon's id layout: codes at 4..8195), window 16, top-k 2000, CFG 3, at each batch size.
   Best of `--repeats` calls on random float32 logits, warm-up excluded, in CPU time of one thread
   (intra-op threads off), so that other processes on a shared machine do not distort the ratios.
2. A decode: AR and SJD (window 16) on a tiny random Lumina-mGPT (Chameleon architecture, hidden
   size 64, 2 layers, the real 65536-id vocabulary and grammar, `--grids` x `--grids` 32-px grids)
   on CPU, with Lumina's sampling (conf/model/lumina.yaml), new pipeline and old pipeline patched
   in: the summary's stage fractions of decode time and efficiency (sjd.harness.results.summary_rows).
   A tiny model makes the forward cheap, so the pipeline's share is an upper bound for real models.
   `--standin standin_lumina_512` decodes on a shipped stand-in instead (its captions, its 1061 steps).
   lap_cost_frac: the stage clock's own cost (laps made x one lap's cost) over decode time.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

import sjd.decoders.ar
import sjd.decoders.base
import sjd.decoders.sjd
from sjd.core import sampling
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.stages import StageClock
from sjd.harness.results import STAGE_COLUMNS, markdown_table, summary_rows
from sjd.types import ImageLayout, Logits, Prompt

ROOT = Path(__file__).resolve().parents[1]
CODE0, N_CODES, WINDOW, TOP_K, CFG = 4, 8192, 16, 2000, 3.0


def load_reference():
    """The replaced pipeline, from the test that keeps it verbatim."""
    spec = importlib.util.spec_from_file_location("reference", ROOT / "tests" / "test_logits_pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def old_check_finite(logits: Logits, model: str, prompt_ids, step: int) -> None:
    """The finite check before the single reduction: a per-row scan of the full vocabulary."""
    for branch, t in (("conditional", logits.cond), ("unconditional", logits.uncond)):
        if t is None:
            continue
        bad = (~torch.isfinite(t)).flatten(1).any(1)
        if bool(bad.any()):
            raise FloatingPointError(f"model {model!r} returned NaN/inf {branch} logits at forward {step}")


def chameleon_like_layout(vocab: int, n_tokens: int = 64) -> ImageLayout:
    forced = torch.full((n_tokens,), -1, dtype=torch.long)
    forced[0], forced[9::9] = CODE0 + N_CODES + 1, vocab - 1  # begin-of-image, end-of-line every row
    free = torch.zeros(vocab, dtype=torch.bool)
    free[CODE0 : CODE0 + N_CODES] = True
    return ImageLayout(n_tokens, 7, 8, 9, 1, forced, free, vocab)


def best_s(fn, args: tuple, repeats: int) -> float:
    """Best CPU time of `repeats` calls after a warm-up, on one thread (see bench_pipeline)."""
    fn(*args)
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn(*args)
        times.append(time.thread_time() - t0)
    return min(times)


def bench_pipeline(batches: list[int], repeats: int) -> pd.DataFrame:
    """Old against new pipeline, timed as the CPU time of one thread: intra-op threads off, so the
    calling thread does all the work and other processes on a shared machine do not inflate it."""
    ref = load_reference()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    settings = SamplingConfig(cfg_scale=CFG, temperature=1.0, top_k=TOP_K)
    rows = []
    for vocab in (8832, 65536):
        layout = chameleon_like_layout(vocab)
        for B in batches:
            g = torch.Generator().manual_seed(0)
            logits = Logits(torch.randn(B, WINDOW, vocab, generator=g), torch.randn(B, WINDOW, vocab, generator=g))
            positions = torch.arange(WINDOW)[None].expand(B, -1) + 1
            window = (logits, positions, layout, settings)
            old = best_s(ref.logits_to_probs, window, repeats)
            new = best_s(sampling.logits_to_probs, window, repeats)
            old_f = best_s(old_check_finite, (logits, "bench", [], 1), repeats)
            new_f = best_s(sjd.decoders.base.check_finite, (logits, "bench", [], 1), repeats)
            rows.append(
                dict(vocab=vocab, batch=B, old_probs_ms=1e3 * old, new_probs_ms=1e3 * new, probs_speedup=old / new,
                     old_finite_ms=1e3 * old_f, new_finite_ms=1e3 * new_f, finite_speedup=old_f / new_f,
                     total_speedup=(old + old_f) / (new + new_f))
            )  # fmt: skip
    torch.set_num_threads(threads)
    return pd.DataFrame(rows)


@contextmanager
def old_pipeline():
    """Patch the replaced pipeline and finite check into AR and SJD."""
    ref = load_reference()
    saved = (sjd.decoders.ar.logits_to_probs, sjd.decoders.sjd.logits_to_probs, sjd.decoders.base.check_finite)
    sjd.decoders.ar.logits_to_probs = sjd.decoders.sjd.logits_to_probs = ref.logits_to_probs
    sjd.decoders.base.check_finite = old_check_finite
    try:
        yield
    finally:
        sjd.decoders.ar.logits_to_probs, sjd.decoders.sjd.logits_to_probs, sjd.decoders.base.check_finite = saved


def tiny_lumina(grids: int):
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    from sjd.models.lumina import LuminaAdapter

    digits = str.maketrans("0123456789", "ABCDEFGHIJ")
    vmap = {"<s>": 0, "<pad>": 1, "</s>": 2, "<image>": 3}
    vmap |= {f"IMGIMG{str(i).translate(digits)}Z": CODE0 + i for i in range(N_CODES)}
    vmap |= {"<eoss>": 8196, "<racm3:break>": 8197}
    vmap |= {f"<reserved{n:05d}>": n + 4 for n in (8706, 8799, *range(8801, 8865))}
    config = ChameleonConfig(
        vocab_size=65536, vocabulary_map=vmap, bos_token_id=0, pad_token_id=1, eos_token_id=2, hidden_size=64,
        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        vq_config=dict(embed_dim=8, latent_channels=8, base_channels=32, channel_multiplier=[1, 2], num_res_blocks=1,
                       attn_resolutions=[]),
    )  # fmt: skip
    torch.manual_seed(0)
    model = ChameleonForConditionalGeneration(config).eval()
    return LuminaAdapter.from_model(model, lambda text: [20000 + ord(c) % 256 for c in text], grids, grids)


def lap_seconds(n: int = 100_000) -> float:
    """What one lap of a running stage clock costs (CPU)."""
    clock = StageClock(torch.device("cpu"))
    clock.begin()
    t0 = time.perf_counter()
    for _ in range(n):
        clock.lap("draft")
    return (time.perf_counter() - t0) / n


def bench_decode(batches: list[int], old_batches: list[int], grids: int, standin: str | None = None) -> pd.DataFrame:
    if standin:
        from sjd.standin.adapter import StandinLuminaAdapter
        from sjd.standin.procedural import all_themes

        adapter, captions = StandinLuminaAdapter(asset=standin, name=standin), [t.caption for t in all_themes()]
    else:
        adapter = tiny_lumina(grids)
        captions = [f"prompt number {i}: a red fox in the snow" for i in range(max(batches))]
    lap_s = lap_seconds()
    print(f"one stage-clock lap: {1e6 * lap_s:.2f} us")
    s = OmegaConf.load(ROOT / "conf" / "model" / "lumina.yaml").sampling
    settings = SamplingConfig(float(s.cfg_scale), float(s.temperature), s.top_k, s.top_p)
    warm = [Prompt("warm-up", "a warm-up decode, not reported")]
    ARDecoder().generate(adapter, warm, settings, make_generators(0, ["warm-up"], adapter.device))
    tables = []
    for B in batches:
        prompts = [Prompt(f"p{i}", captions[i % len(captions)]) for i in range(B)]
        pipelines = [("new", contextmanager(lambda: (yield)))] + [("old", old_pipeline)] * (B in old_batches)
        for label, patch in pipelines:
            rows = []
            for d in (ARDecoder(), SJDDecoder(window=WINDOW)):
                gens = make_generators(0, [p.prompt_id for p in prompts], adapter.device)
                with patch():
                    res = d.generate(adapter, prompts, settings, gens)
                rows += [
                    dict(decoder=d.name, n_tokens=adapter.layout.n_tokens, n_forward=res.n_forward[b],
                         latency_s=res.latency_s, prefill_s=res.prefill_s, decode_s=res.decode_s,
                         model_s=res.model_s, stage_s=res.stage_s, accepted=res.accepted[b], peak_mem_mb=0.0,
                         peak_mem_kind="none", lap_cost_frac=res.extras["stage_laps"] * lap_s / res.decode_s)
                    for b in range(B)
                ]  # fmt: skip
            samples = pd.DataFrame(rows)
            summary = summary_rows(samples, "ar", {"model": standin or f"tiny-lumina-{grids}x{grids}"})
            summary["lap_cost_frac"] = samples.groupby("decoder", sort=False)["lap_cost_frac"].mean().to_numpy()
            summary.insert(0, "pipeline", label)
            summary.insert(1, "batch", B)
            tables.append(summary)
    cols = ["pipeline", "batch", "decoder", "n_forward", "latency_s", "efficiency", *STAGE_COLUMNS, "lap_cost_frac"]
    return pd.concat(tables)[cols]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", default="1,50")
    ap.add_argument("--grids", type=int, default=2, help="32-px grids per side of the tiny Lumina image")
    ap.add_argument("--old-batches", default=None, help="batches decoded with the old pipeline too (default: all)")
    ap.add_argument("--standin", help="decode on this shipped stand-in (e.g. standin_lumina_512) instead")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-pipeline", action="store_true")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_grad_enabled(False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    old_batches = batches if args.old_batches is None else [int(b) for b in args.old_batches.split(",")]
    if not args.skip_pipeline:
        print("\n## Pipeline alone (window 16, top-k 2000, CFG 3, 8192 free codes; CPU ms of one thread)\n")
        print(markdown_table(bench_pipeline(batches, args.repeats), floatfmt=".2f"))
    if not args.skip_decode:
        what = args.standin or f"tiny random Lumina-mGPT, {args.grids}x{args.grids} grids"
        print(f"\n## Decode: {what}, Lumina sampling\n")
        print(markdown_table(bench_decode(batches, old_batches, args.grids, args.standin), floatfmt=".3f"))


if __name__ == "__main__":
    main()
