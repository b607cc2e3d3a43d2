"""One benchmark run: decoders x prompts on one model, timed side by side, written to disk.

Order of work, so that bad input fails before anything expensive and nothing finished is lost:
1. validate the config (types and ranges of every key, the device: sjd/harness/config_check.py; then
   sampling and decoder settings) - no model loaded yet;
2. load and select prompts (errors name file and line);
3. under torchrun, join the other ranks and take rank 0's run directory (sjd/harness/distributed.py);
4. build the model adapter (a missing checkpoint names its path and config key);
5. check every prompt against the model (errors name the prompt id) and every decoder's
   required capabilities;
6. find the finished samples (resume) and deal the unfinished prompts to the ranks, round-robin;
7. warm up each decoder on the first batch (not recorded);
8. per batch of prompts, run every decoder, alternating their order from batch to batch so
   neither always runs first, save each sample's image and append the sample to samples.jsonl
   (under torchrun: to the rank's own samples.rank{r}.jsonl);
9. (rank 0, after every rank is done) merge the samples into samples.jsonl in prompt order,
   summarise from it (FID/CLIP and the in-run audit when asked), write summary.csv/json and
   grid.png, append to `results_csv`.

`run` does steps 1-3; each rank then runs `build` (4-6), `decode` (7-8), and rank 0 `summarise`
and `publish` (9). Every sample line is a `SampleRecord` (sjd/harness/results.py).

Data-parallel: `torchrun --nproc_per_node=N run.py ...` (gloo on the CPU, nccl with one GPU per rank).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pandas as pd
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from sjd.audit.in_run import audit_caption, audit_decoders, teacher_forced_batch, with_teacher_forced_audit
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import prompt_seed, sample_generators
from sjd.decoders.base import Decoder, device_sync
from sjd.harness import contention
from sjd.harness.config_check import check_run_config
from sjd.harness.decoder_configs import settle_named_rows
from sjd.harness.distributed import DataParallel, shard
from sjd.harness.engine_watch import EngineWatch
from sjd.harness.plots import accept_histograms
from sjd.harness.prompts import PromptSet, load_prompt_set, resolve_path
from sjd.harness.provenance import (
    git_hash,
    peak_memory_mb,
    reset_peak_memory,
    run_command,
    versions,
)
from sjd.harness.ranks import rank_info
from sjd.harness.results import (
    SampleKey,
    SampleRecord,
    SampleWriter,
    append_results_row,
    finished_samples,
    image_name,
    make_grid,
    merge_samples,
    read_samples,
    sample_files,
    shard_file,
    summary_rows,
    write_summary,
)
from sjd.harness.shadow import check_same_shadow, shadow_record, unshadowed, with_shadow
from sjd.models.base import ModelAdapter
from sjd.models.loading import networks_sha
from sjd.types import Prompt

log = logging.getLogger(__name__)
TABLE_COLUMNS = [
    "decoder",
    "n_forward",
    "step_compression",
    "latency_s",
    "latency_speedup",
    "outside_model_frac",
    "efficiency",
]


def pick_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def build_decoders(cfg: DictConfig) -> tuple[list[Decoder], str | None]:
    """[baseline, decoder] (baseline omitted when null or the same decoder), baseline name."""
    decoders = []
    baseline = cfg.get("baseline")
    if baseline is not None and baseline.name != cfg.decoder.name:
        decoders.append(instantiate(baseline))
    decoders.append(instantiate(cfg.decoder))
    for extra in cfg.get("extra_decoders") or []:
        decoders.append(instantiate(extra))
    for named in (cfg.get("named_decoders") or {}).values():  # conf/decoder configs an overlay named
        decoders.append(instantiate(named))
    names = [d.name for d in decoders]
    if len(set(names)) != len(names):
        raise ValueError(f"decoder names must be unique within a run, got {names}")
    return decoders, (baseline.name if baseline is not None else None)


def scores_images(cfg: DictConfig) -> bool:
    """Whether the run's `eval` config asks for FID or CLIP (eval=none does not)."""
    eval_cfg = cfg.get("eval")
    return eval_cfg is not None and bool(eval_cfg.get("fid") or eval_cfg.get("clip"))


def config_fingerprint(cfg: DictConfig) -> str:
    """What decides a run's samples: model, decoders, prompts, sampling, seed. Not the batch size: a prompt's
    samples follow one distribution at any batch size (its tokens too, up to float rounding of batched kernels:
    docs/design.md §3), so a run may resume with a smaller one."""
    keys = ("model", "decoder", "baseline", "extra_decoders", "prompts", "seed")
    picked = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg.get(k)) else cfg.get(k)
              for k in keys}  # fmt: skip
    if seeds_per_prompt(cfg) != 1:  # only then, so a one-seed run keeps the fingerprint it always had
        picked["seeds_per_prompt"] = seeds_per_prompt(cfg)
    if cfg.get("named_decoders"):  # likewise: a run without them keeps its fingerprint
        picked["named_decoders"] = OmegaConf.to_container(cfg.named_decoders, resolve=True)
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:16]


def seeds_per_prompt(cfg: DictConfig) -> int:
    """How many samples each prompt gets (sample k seeded from (seed + k, prompt id)); validated."""
    n = cfg.get("seeds_per_prompt", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"seeds_per_prompt must be an integer >= 1, got {n!r}")
    return n


Sample = tuple[Prompt, int]  # a prompt and its seed index


def resume_point(run_dir: Path, fingerprint: str) -> set[SampleKey]:
    """The (decoder, prompt, seed index) samples already finished in `run_dir` by a run of the same config.
    A run directory holding another config's samples is refused: mixing them would be wrong."""
    meta_file = run_dir / "meta.json"
    if not sample_files(run_dir):
        return set()
    old = json.loads(meta_file.read_text()).get("config_fingerprint") if meta_file.is_file() else None
    if old != fingerprint:
        raise ValueError(
            f"{run_dir} holds samples of a different run config (fingerprint {old}, this run {fingerprint}); "
            "refusing to mix them. Start fresh with another hydra.run.dir=..., or delete that directory."
        )
    done = finished_samples(run_dir)
    log.info("resuming %s: %d samples already finished", run_dir, len(done))
    return done


def batches(samples: list[Sample], size: int) -> list[list[Sample]]:
    return [samples[i : i + size] for i in range(0, len(samples), size)]


def run(cfg: DictConfig, run_dir: str | Path) -> pd.DataFrame | None:
    """Run the benchmark into `run_dir`; the summary, or None on a torchrun rank other than 0.

    Under `torchrun --nproc_per_node=N run.py ...` every rank runs this: rank 0's run directory is
    used by all; the unfinished prompts are dealt round-robin to the ranks; each rank appends to its
    own samples.rank{r}.jsonl; after a barrier rank 0 merges them into samples.jsonl and writes the
    summary, images grid, results row and logger output, and computes FID/CLIP, once. A prompt's
    tokens depend only on (seed, prompt id), so the samples equal a one-process run's. Latencies
    stay per-prompt measurements, but N ranks on one machine contend for its CPU cores (and memory
    bandwidth): compare latencies only between runs of the same world size (recorded in the summary).
    """
    settle_named_rows(cfg)  # an overlay's rows named by their rows, at the study's window (named_window)
    check_run_config(cfg)  # types, ranges and the device, naming the key, before anything is loaded
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    seeds_per_prompt(cfg)
    audit_caption(cfg)
    teacher_forced_batch(cfg)
    sampling = SamplingConfig(**OmegaConf.to_container(cfg.model.sampling))
    decoders, baseline = build_decoders(cfg)
    prompt_set = load_prompt_set(**OmegaConf.to_container(cfg.prompts))
    eval_cfg = None
    if scores_images(cfg):
        from sjd.eval.quality import check_eval  # torchmetrics and scipy take seconds to import

        eval_cfg = check_eval(cfg.eval)

    dp = DataParallel.start(rank_info(), pick_device(cfg.device), timedelta(minutes=cfg.dist_timeout_min))
    try:
        summary = _run_rank(cfg, dp.adopt_run_dir(run_dir), dp, sampling, decoders, baseline, prompt_set, eval_cfg)
    except Exception as e:
        dp.report_failure(e)  # torchrun then stops the other ranks, with this message in its report
        raise
    dp.close()
    return summary


@dataclass
class RankJob:
    """What a rank decodes and rank 0 publishes, once the model is built: the run's config and
    directory, the ranks, the model, the decoders, the prompts and the run's record (meta.json)."""

    cfg: DictConfig
    run_dir: Path
    dp: DataParallel
    adapter: ModelAdapter
    decoders: list[Decoder]
    baseline: str | None
    prompt_set: PromptSet
    meta: dict
    samples: list[Sample]  # every (prompt, seed index) of the run, in order
    done: set[SampleKey]  # the samples finished before this run started (resume)
    started: float  # perf_counter when the model began to load (the run's wall time, in publish)

    @property
    def decoder_names(self) -> list[str]:
        return [d.name for d in self.decoders]


def _run_rank(
    cfg: DictConfig,
    run_dir: Path,
    dp: DataParallel,
    sampling: SamplingConfig,
    decoders: list[Decoder],
    baseline: str | None,
    prompt_set: PromptSet,
    eval_cfg: dict | None,
) -> pd.DataFrame | None:
    """One rank's run: build the model and resume point, decode this rank's share, then (rank 0
    alone) summarise every rank's samples and publish the summary."""
    job = build(cfg, run_dir, dp, decoders, baseline, prompt_set)
    decode(job, sampling)
    if not dp.info.is_main:
        return None
    summary, samples = summarise(job, sampling, eval_cfg)
    publish(job, summary, samples)
    return summary


def build(
    cfg: DictConfig,
    run_dir: Path,
    dp: DataParallel,
    decoders: list[Decoder],
    baseline: str | None,
    prompt_set: PromptSet,
) -> RankJob:
    """The adapter (checked against every prompt and decoder), the run's record and, on rank 0,
    the resume point and meta.json; every rank gets the same finished samples."""
    started = time.perf_counter()
    adapter: ModelAdapter = instantiate(cfg.model.adapter, device=dp.device)
    adapter = with_shadow(cfg, adapter, decoders)  # a real architecture timed beside it, where `shadow` names one
    adapter.use_cache(cfg.get("cache", "dynamic"))  # AR and every decoder run on the same engine
    if cfg.get("compile", False):  # eager with eager, compiled with compiled: the baseline is compiled too
        backend = cfg.get("compile_backend")
        adapter.compile_windows(compile_mode(cfg, adapter.device), backend)
        for d in decoders:  # and the pipeline, verification and sampling each iteration runs beside the forward
            d.compile_kernels(compile_mode(cfg, adapter.device), backend)
    adapter.check_prompts(prompt_set.prompts)
    for d in decoders:
        d.check(adapter)
    meta = run_meta(cfg, adapter, decoders, baseline, prompt_set, dp)
    done = None
    if dp.info.is_main:  # only rank 0 reads, repairs and writes the run directory before decoding
        done = resume_point(run_dir, meta["config_fingerprint"])
        check_same_shadow(run_dir, shadow_record(adapter))
        (run_dir / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    done = dp.broadcast(done)  # every rank deals the same unfinished prompts
    samples = [(p, k) for p in prompt_set.prompts for k in range(seeds_per_prompt(cfg))]
    return RankJob(cfg, run_dir, dp, adapter, decoders, baseline, prompt_set, meta, samples, done, started)


def compile_mode(cfg: DictConfig, device: torch.device | str) -> str:
    """torch.compile's mode under compile=true: `compile_mode`, or by default `reduce-overhead` (CUDA graphs: one
    launch a forward) on CUDA and `default` (inductor) on the CPU, which has no graphs to capture."""
    mode = cfg.get("compile_mode")
    return mode if mode else ("reduce-overhead" if torch.device(device).type == "cuda" else "default")


def run_meta(
    cfg: DictConfig,
    adapter: ModelAdapter,
    decoders: list[Decoder],
    baseline: str | None,
    prompt_set: PromptSet,
    dp: DataParallel,
) -> dict:
    """The run's record: meta.json, and the provenance columns of every summary row."""
    return {
        "model": adapter.name,
        "model_training": adapter.training_record,  # a stand-in's recipe and hashes; None for released weights
        "weights_sha": weights_sha(adapter, decoders),
        "prompt_set": prompt_set.name,
        "prompt_file_sha256": prompt_set.sha256,
        "prompt_selection": prompt_set.selection,
        "seed": cfg.seed,
        "seeds_per_prompt": seeds_per_prompt(cfg),
        "batch_size": cfg.batch_size,
        "sampling": OmegaConf.to_container(cfg.model.sampling),
        "decoder_configs": {d.name: d.config() for d in decoders},
        "decoder_classes": {d.name: type(d).__name__ for d in decoders},  # how sjd.harness.pricing finds its counts
        "decoder_lossless": {d.name: d.lossless for d in decoders},
        "baseline": baseline,
        "device": dp.device,
        "cache": adapter.cache_kind,
        "compiled": bool(cfg.get("compile", False)),
        "compile_mode": compile_mode(cfg, dp.device) if cfg.get("compile", False) else None,
        "compile_backend": cfg.get("compile_backend") if cfg.get("compile", False) else None,
        "world_size": dp.info.world_size,
        "git_hash": git_hash(),
        "versions": versions(),
        "experiment": cfg.get("experiment_name"),
        "command": run_command(),
        "config_fingerprint": config_fingerprint(cfg),
        **pricing(cfg),
        **shadow_record(adapter),  # what timed the forwards; not in the fingerprint, the samples are the model's
    }


def pricing(cfg: DictConfig) -> dict:
    """The real architecture the model's forwards are priced as (`model.prices_as`: a stand-in's is the model it
    stands for) and an EAGLE drafter forward's price in its target forwards (sjd.core.cost.byte_ratio; the
    drafters compute the full LM head). None where the model names none (the toy and micro models)."""
    from sjd.core.cost import drafter_price

    name = cfg.model.get("prices_as")
    return {"prices_as": name, "drafter_byte_ratio": None if name is None else drafter_price(name)}


def weights_sha(adapter: ModelAdapter, decoders: list[Decoder]) -> dict[str, str]:
    """The hash of the weights this run decodes with, as loaded: the model's networks (`model`), and each decoder's
    own (a drafter) under the decoder's name. Pages match audits to runs by it (studies.regime)."""
    out = {"model": networks_sha(adapter.networks())}
    for d in decoders:
        if own := d.networks(adapter):
            out[d.name] = networks_sha(own)
    return out


def decode(job: RankJob, sampling: SamplingConfig) -> None:
    """Decode this rank's share of the unfinished samples into its sample file, then wait for every rank."""
    todo = [(p, k) for p, k in job.samples if any((d.name, p.prompt_id, k) not in job.done for d in job.decoders)]
    info = job.dp.info
    writer = SampleWriter(job.run_dir, shard_file(job.run_dir, info.rank) if info.distributed else None)
    before = contention.sample()
    with contention.LoadSampler() as others:  # other work on the machine, every second of the decode
        warm = decode_prompts(job.cfg, job.adapter, job.decoders, sampling, shard(todo, info), job.done, writer)
    job.meta |= warm
    job.meta |= contention.assess(before, contention.sample(), job.dp.device, samples=others.samples)
    job.dp.barrier("every rank has decoded its prompts")
    if info.is_main:  # meta.json gains the machine's load over the decode (latency_reliable)
        (job.run_dir / "meta.json").write_text(json.dumps(job.meta, indent=2, default=str))


def summarise(job: RankJob, sampling: SamplingConfig, eval_cfg: dict | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary, samples): every rank's samples merged into samples.jsonl, one summary row per
    decoder, with FID/CLIP when the eval config asks for them and the in-run audit when `audit.n` is set."""
    merge_samples(job.run_dir, job.decoder_names, [(p.prompt_id, k) for p, k in job.samples])
    samples = read_samples(job.run_dir)
    summary = summary_rows(samples, job.baseline, job.meta)
    model = unshadowed(job.adapter)  # no row times this work: the shadow has nothing to add
    if eval_cfg:
        from sjd.eval.quality import evaluate

        quality = evaluate(eval_cfg, samples, model, resolve_path("outputs/cache"))
        summary = summary.merge(quality, on="decoder", how="left")
    if audit_caption(job.cfg):
        audit = audit_decoders(job.cfg, model, job.decoders, sampling)
        summary = summary.merge(audit, on="decoder", how="left")
    summary = with_teacher_forced_audit(job.cfg, summary, samples, model, job.decoders, sampling)
    return summary, samples


def publish(job: RankJob, summary: pd.DataFrame, samples: pd.DataFrame) -> None:
    """summary.csv/json, accept_hist.png, grid.png, the results row, the logger's record, and the
    table printed for the user."""
    cfg, run_dir = job.cfg, job.run_dir
    # this invocation's wall time, model load to audits: a resumed run counts only what it redid
    summary = summary.assign(run_wall_s=time.perf_counter() - job.started)
    write_summary(summary, run_dir)
    accept_histograms(summary, run_dir / "accept_hist.png")
    if cfg.save_images:
        make_grid(run_dir, job.decoder_names, [p.prompt_id for p in job.prompt_set.prompts[: cfg.grid_prompts]])
    if cfg.results_csv:
        append_results_row(summary, resolve_path(cfg.results_csv), run_dir)
    logger = instantiate(cfg.logger)
    logger.log_run(run_dir, summary, samples, OmegaConf.to_container(cfg, resolve=True))

    shown = TABLE_COLUMNS + [c for c in ("fid", "clip", "audit_tv", "audit_p", "tf_p") if c in summary.columns]
    table = summary[shown].to_string(index=False, float_format=lambda x: f"{x:.3f}")
    world = f", {job.dp.info.world_size} ranks" if job.dp.info.distributed else ""
    where = f"{job.prompt_set.name} ({job.prompt_set.selection}{world})"
    print(f"\n{job.adapter.name} on {where}, run dir {run_dir}\n{table}")
    if contention.warning(job.meta):
        print(contention.warning(job.meta))


def decode_prompts(
    cfg: DictConfig,
    adapter: ModelAdapter,
    decoders: list[Decoder],
    sampling: SamplingConfig,
    samples: list[Sample],
    done: set[SampleKey],
    writer: SampleWriter,
) -> dict:
    """Warm up, then decode `samples` (prompt, seed index) batch by batch with every decoder, skipping
    finished (decoder, prompt, seed index) samples, and append each (after its image) through `writer`.

    Returns what the timing leaves out, for the summary rows: each decoder's warm-up seconds (`warmup_s`, which
    holds the compile time under compile=true) and what the engine did (sjd.harness.engine_watch): the graphs
    compiled after the warm-up (`graphs_compiled_timed`: 0 unless a batch of another size or a window width the
    warm-up did not meet had to compile), graph breaks, CUDA-graph skips and static cache reallocations."""
    groups = batches(samples, cfg.batch_size)
    watch = EngineWatch(adapter, strict=bool(cfg.get("compile_strict", False)))
    warmup_s = {}
    for d in decoders:  # warm-up: first use of kernels and allocator (and compiling), not recorded
        started = time.perf_counter()
        for group in groups[: max(0, cfg.warmup)]:
            gens = sample_generators(cfg.seed, [(p.prompt_id, k) for p, k in group], adapter.device)
            d.generate(adapter, [p for p, _ in group], sampling, gens)
        warmup_s[d.name] = round(time.perf_counter() - started, 3)
    watch.warmed_up()

    todo = sum((d.name, p.prompt_id, k) not in done for d in decoders for p, k in samples)
    progress = tqdm(total=todo, desc="decoding", unit="image", disable=None)
    with watch.timed():
        for i, full_group in enumerate(groups):
            order = decoders if i % 2 == 0 else decoders[::-1]
            for d in order:
                # Resuming: only the prompts this decoder has not finished. A prompt's tokens do not
                # depend on its batch, so the resumed run ends with the same samples.
                group = [(p, k) for p, k in full_group if (d.name, p.prompt_id, k) not in done]
                if group:
                    decode_group(cfg, adapter, d, sampling, group, writer)
                    progress.update(len(group))
    progress.close()
    return {"warmup_s": warmup_s, **watch.facts()}


def decode_group(
    cfg: DictConfig,
    adapter: ModelAdapter,
    decoder: Decoder,
    sampling: SamplingConfig,
    group: list[Sample],
    writer: SampleWriter,
) -> None:
    """Decode one batch with one decoder; save each sample's image, then append its record."""
    ids = [(p.prompt_id, k) for p, k in group]
    reset_peak_memory(adapter.device)
    try:
        gens = sample_generators(cfg.seed, ids, adapter.device)
        result = decoder.generate(adapter, [p for p, _ in group], sampling, gens)
    except torch.cuda.OutOfMemoryError as e:
        raise RuntimeError(
            f"out of GPU memory decoding prompts {ids} with decoder {decoder.name!r} (batch_size={cfg.batch_size}, "
            f"window={getattr(decoder, 'window', None)}). Finished samples are kept in {writer.path}; rerun the "
            f"same command with hydra.run.dir={writer.path.parent} and a smaller batch_size to resume."
        ) from e
    peak_mem = peak_memory_mb(adapter.device)
    t_images = time.perf_counter()
    images = adapter.decode_images(result.tokens) if cfg.save_images else None
    device_sync(adapter.device)
    image_decode_s = (time.perf_counter() - t_images) / len(group) if cfg.save_images else float("nan")
    timed_batch = f"{group[0][0].prompt_id}#{group[0][1]}"  # the latency intervals' unit (sjd.harness.intervals)
    for b, (prompt, k) in enumerate(group):
        if images is not None:  # the image first: a sample on record always has its image
            writer.save_image(decoder.name, image_name(prompt.prompt_id, k), images[b])
        seed = prompt_seed(cfg.seed + k, prompt.prompt_id)
        record = SampleRecord.of_row(result, b, prompt, k, seed, decoder.name, image_decode_s, peak_mem, timed_batch)
        writer.write(record)
