"""What `scripts/train_drafter.py --check*` and `--remeasure` do: check a shipped drafter against its record (its
weights' hash, its arguments' hash, its command, its target, and a probe of the recipe's first steps), retrain it in
full to compare bit for bit, and measure its acceptance again. The training itself is sjd.training.drafter.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from omegaconf import DictConfig

from sjd.drafters.checkpoint import resolve
from sjd.drafters.recipe import (
    WEIGHTS_FILE,
    Finding,
    file_sha256,
    read_record,
    recipe_sha,
    target_identity,
    write_record,
)
from sjd.training.drafter import (
    PROBE_SAMPLES_FILE,
    ROOT,
    build,
    load_probe_samples,
    load_target,
    measure,
    probe_fingerprint,
    probe_samples,
    recipe_arguments,
    samples_sha,
    save_probe_samples,
    training_captions,
)


# -- checks ----------------------------------------------------------------------------------------------------
def compose(overrides: list[str]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from sjd.harness.config import register_resolvers

    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = hydra_compose("train_drafter", overrides=overrides)
    GlobalHydra.instance().clear()
    return cfg


NOT_CHECKED = (
    "that a full retrain gives these weights: the probe reruns only the recipe's first steps on a few images, so "
    "a change of code that acts later (the schedule's decay, clipping, rows the probe's coins did not pick) or "
    "weakly (weight decay over a few steps) can pass it; `--check-retrain DIR` retrains in full (minutes) and "
    "compares bit for bit",
    "that the full training data hash to the recorded data_sha (a retrain regenerates them)",
    "that the drafter is useful: the record's `measured` acceptance, or a decoder=eagle run",
)


def check_weights(directory: Path, record: dict) -> Finding:
    path = directory / WEIGHTS_FILE
    actual = file_sha256(path) if path.is_file() else "absent"
    return Finding(actual == record.get("weights_sha"), "weights",
                   f"{WEIGHTS_FILE} hashes (sha256) to {actual[:16]}, the record's weights_sha is "
                   f"{str(record.get('weights_sha'))[:16]}")  # fmt: skip


def check_argument_hash(record: dict) -> Finding:
    ours = recipe_sha(record["recipe"])
    said = f"the record's recipe arguments hash to {ours}, its recipe_sha is {record['recipe_sha']}"
    return Finding(ours == record["recipe_sha"], "arguments", said)


def check_command(record: dict) -> Finding:
    differ = _flat_differences(record["recipe"], recipe_arguments(compose(record["overrides"])))
    said = "the recorded arguments" if not differ else "other arguments: " + "; ".join(differ)
    return Finding(not differ, "command", f"`{record['command']}` composes, from today's conf/, {said}")


def check_target(adapter, record: dict) -> Finding:
    ours, theirs = target_identity(adapter), record["target"]
    same = "the recorded one" if ours == theirs else f"not the recorded {theirs}"
    return Finding(ours == theirs, "target", f"today's target {ours} is {same}")


def check_probe(adapter, record: dict, directory: Path) -> Finding:
    from sjd.standin.training import FINGERPRINT_TOLERANCE, fingerprint_gaps

    args = record["recipe"]
    samples = load_probe_samples(directory)
    if samples is None:
        return Finding(False, "probe", f"{directory} has no {PROBE_SAMPLES_FILE} (a drafter trained before the probe "
                       "kept its samples): `--record-probe-samples DIR` samples them once and keeps them if they give "
                       "the recorded fingerprint")  # fmt: skip
    if samples_sha(samples) != record["probe"].get("samples_sha"):
        return Finding(False, "probe", f"{PROBE_SAMPLES_FILE} hashes to {samples_sha(samples)[:16]}, the record's "
                       f"probe.samples_sha is {str(record['probe'].get('samples_sha'))[:16]}")  # fmt: skip
    prompts, _ = training_captions(args, adapter)
    gaps = fingerprint_gaps(probe_fingerprint(adapter, args, prompts, samples), record["probe"]["fingerprint"])
    worst = max(gaps, key=gaps.get)
    return Finding(gaps[worst] <= FINGERPRINT_TOLERANCE, "probe",
                   f"today's code, run from the recorded arguments for the recipe's first {args['probe']['steps']} "
                   f"training steps on its first {args['probe']['images']} images (the recorded samples, "
                   f"teacher-forced again on this CPU), gives weights whose fingerprint differs from the recorded one "
                   f"by at most {gaps[worst]:.2g} of a tensor's rms (in {worst}); a CPU's rounding stays under "
                   f"{FINGERPRINT_TOLERANCE:g}, a change of the captions, features, initialisation, loss or optimiser "
                   "step moves it further")  # fmt: skip


def recorded_target(directory: Path) -> tuple | None:
    """A drafter's record, its recipe arguments, its target on the CPU at the recipe's thread count and the
    recipe's captions; None (said) where the directory has no drafter.json with a recipe."""
    record = read_record(directory)
    if record is None or "recipe" not in record:
        print(f"{directory}: no drafter.json with a recipe")
        return None
    args = record["recipe"]
    torch.set_num_threads(args["threads"])
    adapter = load_target(args, "cpu")
    prompts, _ = training_captions(args, adapter)
    return record, args, adapter, prompts


def record_probe_samples(directory: Path) -> int:
    """Sample the probe's images of a drafter trained before the probe kept its samples, and keep them (with
    their hash in the record) only if they give the recorded fingerprint: samples drawn on another CPU than the
    training one can differ, and then nothing is written."""
    from sjd.standin.training import FINGERPRINT_TOLERANCE, fingerprint_gaps

    loaded = recorded_target(directory)
    if loaded is None:
        return 1
    record, args, adapter, prompts = loaded
    samples = probe_samples(adapter, args, prompts)
    gaps = fingerprint_gaps(probe_fingerprint(adapter, args, prompts, samples), record["probe"]["fingerprint"])
    worst = max(gaps.values())
    if worst > FINGERPRINT_TOLERANCE:
        print(f"{directory}: these samples give a fingerprint {worst:.2g} of a tensor's rms from the recorded one "
              f"(tolerance {FINGERPRINT_TOLERANCE:g}): not the training's samples; nothing written")  # fmt: skip
        return 1
    save_probe_samples(directory, samples)
    record["probe"]["samples_sha"] = samples_sha(samples)
    write_record(directory, record)
    print(f"{directory}: kept {PROBE_SAMPLES_FILE} ({samples_sha(samples)[:16]}; fingerprint within {worst:.2g})")
    return 0


def check_recipe(directory: Path, threads: int | None = None) -> tuple[list[Finding], list[str]]:
    """What `--check-recipe` checks, each as one statement that held or not, and what it does not check; on
    `threads` CPU threads (default: the recipe's)."""
    record = read_record(directory)
    if record is None or "recipe_sha" not in record:
        missing = Finding(False, "record", f"{directory} has no drafter.json with a recipe_sha: not this recipe's")
        return [missing], list(NOT_CHECKED)
    findings = [check_weights(directory, record), check_argument_hash(record), check_command(record)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads or record["recipe"]["threads"])
    try:
        adapter = load_target(record["recipe"], "cpu")
        findings += [check_target(adapter, record), check_probe(adapter, record, directory)]
    finally:
        torch.set_num_threads(before)
    return findings, list(NOT_CHECKED)


def _flat_differences(ours: dict, theirs: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(ours) | set(theirs)):
        a, b = ours.get(key, "<absent>"), theirs.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += _flat_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} recorded {a!r}, today {b!r}")
    return out


def check_retrain(directory: Path) -> list[Finding]:
    """Retrain from the recorded command into a temporary directory, regenerating the data (no cache), and compare
    the data hash and the weights with the record's, bit for bit."""
    from safetensors.torch import load_file

    record = read_record(directory)
    if record is None or "overrides" not in record:
        return [Finding(False, "record", f"{directory} has no drafter.json with its command")]
    ours = [o for o in record["overrides"] if not o.startswith(("out=", "data.cache=", "progress="))]
    with tempfile.TemporaryDirectory() as tmp:
        built = build(compose([*ours, f"out={tmp}/drafter", "data.cache=null", "progress=false"]), record["overrides"])
        weights = load_file(f"{tmp}/drafter/{WEIGHTS_FILE}"), load_file(str(directory / WEIGHTS_FILE))
    same = weights[0].keys() == weights[1].keys() and all(torch.equal(v, weights[1][k]) for k, v in weights[0].items())
    data = (
        f"the retrain's data, regenerated, hash to {built['data_sha']}; the record's data_sha is {record['data_sha']}"
    )
    said = "equal the recorded ones bit for bit" if same else "differ from the recorded ones"
    return [
        Finding(built["data_sha"] == record["data_sha"], "data", data),
        Finding(
            same,
            "weights",
            f"the retrain's weights {said} (on another CPU kind or thread count, rounding alone makes them differ)",
        ),  # fmt: skip
    ]


def report(directory: Path, findings: list[Finding], not_checked: list[str]) -> int:
    print(f"{directory}: checked against its record ({directory / 'drafter.json'})")
    print("\n".join(f.line() for f in findings))
    for item in not_checked:
        print(f"  not checked: {item}")
    failed = [f.what for f in findings if not f.ok]
    print(f"{directory}: " + (f"FAILED ({', '.join(failed)})" if failed else "every check above held"))
    return 1 if failed else 0


def remeasure(directory: Path, images: int) -> int:
    """Measure a drafter's first-level acceptance again (as training does) and keep it in its record's `measured`
    entry, which no hash covers: the weights and the recipe stay as they are."""
    from sjd.drafters.checkpoint import load_drafter

    loaded = recorded_target(directory)
    if loaded is None:
        return 1
    record, args, adapter, prompts = loaded
    record["measured"] = measure(load_drafter(adapter, str(directory)), adapter, args, prompts, images)
    write_record(directory, record)
    print(f"{directory}: measured, recorded in drafter.json")
    return 0


def main_check(argv: list[str], description: str = "") -> int:
    """The script's `--check-recipe`, `--check-retrain` and `--measure` modes (their help is `description`)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--check-recipe", metavar="DIR", help="check a drafter against its record (seconds)")
    group.add_argument("--check-retrain", metavar="DIR", help="retrain a drafter and compare bit for bit (minutes)")
    group.add_argument("--measure", metavar="DIR", help="measure a drafter's acceptance again, into its record")
    group.add_argument(
        "--record-probe-samples",
        metavar="DIR",
        help="keep the probe's samples of a drafter trained before they were kept (seconds)",
    )
    ap.add_argument("--images", type=int, default=4, help="--measure: held-out images")
    ap.add_argument("--threads", type=int, help="--check-recipe: CPU threads (default: the recipe's)")
    a = ap.parse_args(argv)
    directory = resolve(a.check_recipe or a.check_retrain or a.measure or a.record_probe_samples)
    if a.record_probe_samples:
        return record_probe_samples(directory)
    if a.measure:
        return remeasure(directory, a.images)
    if a.check_recipe:
        return report(directory, *check_recipe(directory, a.threads))
    return report(directory, check_retrain(directory), [])
