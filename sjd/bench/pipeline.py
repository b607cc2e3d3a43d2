"""How much of a decode the logits pipeline costs, before and after free-column filtering; its command line is
`scripts/bench_pipeline.py`. It reports ratios measured in this run and asserts nothing about time.

1. The pipeline alone (`bench_pipeline`): logits -> probabilities plus the finite check on the forward's
   logits, the implementation it replaced (kept verbatim in sjd/bench/replaced_pipeline.py) against
   sjd.core.sampling, on an 8832-id and a 65536-id vocabulary with 8192 free image codes (Chameleon's id layout:
   codes at 4..8195), window 16, top-k 2000, CFG 3, at each batch size. Best of `repeats` calls on random float32
   logits, warm-up excluded, in CPU time of one thread (intra-op threads off), so that other processes on a
   shared machine do not distort the ratios.
2. A decode (`bench_decode`): AR and SJD (window 16) on a tiny random Lumina-mGPT (Chameleon architecture,
   hidden size 64, 2 layers, the real 65536-id vocabulary and grammar, `grids` x `grids` 32-px grids) on CPU,
   with Lumina's sampling (conf/model/lumina.yaml), new pipeline and old pipeline patched in: the summary's stage
   fractions of decode time and efficiency (sjd.harness.results.summary_rows). A tiny model makes the forward
   cheap, so the pipeline's share is an upper bound for real models. A shipped stand-in's name
   (`standin_lumina_512`, say) decodes on it instead (its captions, its 1061 steps). lap_cost_frac: the stage
   clock's own cost (laps made x one lap's cost) over decode time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf

import sjd.decoders.base
from sjd.bench import replaced_pipeline
from sjd.core import sampling
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.kernels import Kernels
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.stages import StageClock
from sjd.harness.results import STAGE_COLUMNS, markdown_table, summary_rows
from sjd.models.lumina import LuminaAdapter
from sjd.types import ImageLayout, Logits, Prompt

ROOT = Path(__file__).resolve().parents[2]
CODE0, N_CODES, WINDOW, TOP_K, CFG = 4, 8192, 16, 2000, 3.0


def chameleon_like_layout(vocab: int, n_tokens: int = 64) -> ImageLayout:
    """Chameleon's id layout at `vocab` ids: 8192 free codes from id 4, a begin-of-image and an end-of-line forced."""
    forced = torch.full((n_tokens,), -1, dtype=torch.long)
    forced[0], forced[9::9] = CODE0 + N_CODES + 1, vocab - 1  # begin-of-image, end-of-line every row
    free = torch.zeros(vocab, dtype=torch.bool)
    free[CODE0 : CODE0 + N_CODES] = True
    return ImageLayout(n_tokens, 7, 8, 9, 1, forced, free, vocab)


def best_s(fn: Callable, args: tuple, repeats: int) -> float:
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
            old = best_s(replaced_pipeline.logits_to_probs, window, repeats)
            new = best_s(sampling.logits_to_probs, window, repeats)
            old_f = best_s(replaced_pipeline.check_finite, (logits, "bench", [], 1), repeats)
            new_f = best_s(sjd.decoders.base.check_finite, (logits, "bench", [], 1), repeats)
            rows.append(
                dict(vocab=vocab, batch=B, old_probs_ms=1e3 * old, new_probs_ms=1e3 * new, probs_speedup=old / new,
                     old_finite_ms=1e3 * old_f, new_finite_ms=1e3 * new_f, finite_speedup=old_f / new_f,
                     total_speedup=(old + old_f) / (new + new_f))
            )  # fmt: skip
    torch.set_num_threads(threads)
    return pd.DataFrame(rows)


def replaced_kernel_pipeline(
    kernels: Kernels, logits: Logits, positions: torch.Tensor, layout: ImageLayout, sampling: SamplingConfig
) -> torch.Tensor:
    """Kernels.pipeline with the replaced pipeline in place of today's (no kernel of its own to compile)."""
    return replaced_pipeline.logits_to_probs(logits, positions, layout, sampling)


@contextmanager
def old_pipeline() -> Iterator[None]:
    """Patch the replaced pipeline and finite check in wherever the decoders reach them: the kernel set's pipeline
    (every window and AR step), the first position's distribution, and the finite check, immediate or deferred."""
    base = sjd.decoders.base
    saved = (Kernels.pipeline, base.logits_to_probs, base.check_finite, base.finite_rows)
    Kernels.pipeline = replaced_kernel_pipeline
    base.logits_to_probs = replaced_pipeline.logits_to_probs
    base.check_finite, base.finite_rows = replaced_pipeline.check_finite, replaced_pipeline.finite_rows
    try:
        yield
    finally:
        Kernels.pipeline, base.logits_to_probs, base.check_finite, base.finite_rows = saved


def tiny_lumina(grids: int) -> LuminaAdapter:
    """A random two-layer Chameleon with Lumina-mGPT's vocabulary and grammar at `grids` x `grids` 32-px grids."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

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
    """AR and SJD at each batch size, with today's pipeline and (at `old_batches`) the replaced one: one summary
    row per (pipeline, batch, decoder)."""
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


def print_benches(
    batches: list[int],
    repeats: int,
    old_batches: list[int],
    grids: int,
    standin: str | None,
    pipeline: bool,
    decode: bool,
) -> None:
    """Print the pipeline's table and the decode's (each unless switched off), gradients off."""
    torch.set_grad_enabled(False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    if pipeline:
        print("\n## Pipeline alone (window 16, top-k 2000, CFG 3, 8192 free codes; CPU ms of one thread)\n")
        print(markdown_table(bench_pipeline(batches, repeats), floatfmt=".2f"))
    if decode:
        what = standin or f"tiny random Lumina-mGPT, {grids}x{grids} grids"
        print(f"\n## Decode: {what}, Lumina sampling\n")
        print(markdown_table(bench_decode(batches, old_batches, grids, standin), floatfmt=".3f"))
