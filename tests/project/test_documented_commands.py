"""Every command line that README.md and docs/ show works as documented, at tiny size, in a shell
that has done what the README's set-up says and nothing more.

The commands are read from the docs themselves: lines inside fenced code blocks of README.md and
docs/**/*.md that start with `python run.py`, `python scripts/`, `torchrun` or `make`. Each must match
an entry of REGISTRY, which says how it is exercised:
- `run`: typed as documented in a fresh checkout of this tree (tests/checkout_copy.py), plus the
  TINY overrides it does not set itself; it must finish, write a summary per job (with FID and CLIP
  when the toy eval is on) and leave the checkout clean;
- `needs_weights`: a real model; run as documented, it must stop at once with the missing-weights
  error naming `model.adapter.weights` and the checkpoint it looked for (what a user without the
  weights gets);
- `script`: a script typed as documented (with its TINY arguments), which must succeed and leave the
  checkout clean (`paper_tables.py` regenerates the tracked tables identically when no run is there);
- `make`: the target's recipe from the Makefile, which must be a `run.py` command, exercised as `run`;
- `test`: exercised by an existing test (named, and whose source must show the documented form);
- `exempt`: not run here, with the reason.
A documented command that matches no entry fails test_every_documented_command_is_registered, whose
message says how to register it. EXAMPLES are exercised whatever the docs show at the moment.

The shell. README.md's set-up block is `make run`, `make test`, then `source .venv/bin/activate`.
The make steps build `.venv/` in the checkout: a venv with the pinned packages of pyproject.toml and
the checkout installed editable. Building it again here would take minutes and a network, so the
test builds that same venv another way (`readme_venv`): `python -m venv` in the checkout copy, whose
site-packages adds the site-packages of the venv running these tests (which `make test` installed
from the same pyproject.toml; its .pth start-up hooks run too) and, first on the path, the checkout
copy itself, as the editable install does. The steps of the set-up block that are not make steps
are then run as typed: each command runs as `bash -c '<those steps> && <command>'` in the checkout,
started from a bare environment (`BARE_ENV`: HOME, the system PATH, a UTF-8 locale, and what this
test machine is: offline, W&B offline, one thread per process). Nothing points Python anywhere: no
PYTHONPATH, no interpreter path; `python` is what the activation puts first on PATH. A make target
runs its recipe with the Makefile's `$(PY)` (`.venv/bin/python`), as make does. The control
test_without_the_activation_the_documented_run_fails runs the same bare shell without the
activation step and requires the README's first command to fail, so the bare shell cannot pass on
anything the test process has.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from checkout_copy import checkout_copy, git

ROOT = Path(__file__).resolve().parents[2]
PREFIXES = ("python run.py", "python scripts/", "torchrun", "make")
TINY = {"prompts.n": "2", "decoder.window": "4", "warmup": "0"}
SCRIPT_ARGS = {  # arguments appended to a script at tiny size (hydra overrides, or flags where the last wins)
    "audit.py": ["n_samples=20"],  # the test checks the command runs and reports, not its power
    "bench_bookkeeping.py": ["--model", "toy", "--prompts", "1", "--decoders", "ar,sjd", "--windows", "16",
                             "--batches", "1"],
    "count_syncs.py": ["--model", "toy", "--decoders", "ar,sjd", "--windows", "16", "--batches", "1"],
    "bench_engine.py": ["--model", "toy", "--decoders", "ar,sjd", "--window", "4", "--batches", "1", "--prompts", "2"],
    "real_size.py": ["--tiny", "--models", "lumina", "--windows", "1"],
}  # fmt: skip
VENV = ".venv"  # the Makefile's VENV
MAKE_STEPS = ("make run", "make test")  # what readme_venv stands in for
BARE_ENV = {
    "HOME": os.environ.get("HOME", "/tmp"),
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HF_HUB_OFFLINE": "1",  # no network here: a hub id fails at once, with no retries
    "WANDB_MODE": "offline",
    "OMP_NUM_THREADS": "1",
}
REAL_MODELS = "lumina|lumina_sjd2|emu3|emu3_sjd2|janus|janus1b|anole|llamagen"
REAL_EXPERIMENTS = (
    "sjd_lumina_coco5k|pjd_lumina_coco5k|pjd_llamagen_coco5k|sjd2_lumina_coco|sjd2_emu3_coco|scd_lumina_coco5k|"
    "sjd_pac_lumina_coco5k"
)


@dataclass(frozen=True)
class Entry:
    pattern: str  # a regex the whole documented command must match
    how: str  # run | needs_weights | script | make | test | exempt
    note: str = ""  # for test: "tests/<file>.py::<test>"; for exempt: why
    shows: tuple[str, ...] = ()  # for test: what the named test's source must contain


# First match wins. To register a newly documented command, add an entry above the general ones.
REGISTRY = [
    Entry(r"make test(-fast)?", "exempt", "the test suite itself"),
    Entry(r"make (install|lint|format|clean)", "exempt", "set-up and housekeeping; CI runs make lint and make install"),
    Entry(r"make train-toy|python scripts/train_toy\.py.*", "test",
          "tests/models/test_toy_model.py::test_training_script_is_deterministic", ("train_toy.py",)),
    Entry(r"make (run|bench)", "make"),
    Entry(rf"(python run\.py|torchrun .*run\.py).* (model=({REAL_MODELS})|experiment=({REAL_EXPERIMENTS}))( .*)?",
          "needs_weights"),
    Entry(r"torchrun .*run\.py.*", "test",
          "tests/harness/test_distributed.py::test_two_ranks_write_the_samples_of_one_process",
          ("run_py(2,", '"fid"', '"clip"')),
    Entry(r"python run\.py .*hydra\.run\.dir=.*", "test",
          "tests/harness/test_robustness.py::test_a_killed_run_resumes_to_the_same_samples",
          ("SIGKILL", "subprocess.run(command(killed)")),
    Entry(r"python run\.py .*logger=wandb.*", "test", "tests/harness/test_run.py::test_default_run_writes_every_output",
          ('"logger=wandb"', "offline-run-")),
    Entry(r"python run\.py --multirun .*hydra/launcher=local.*", "test",
          "tests/harness/test_configs.py::test_a_sweep_through_the_submitit_local_launcher_is_collected",
          ("hydra/launcher=local", '"decoder=sjd,csjd"', '"decoder.window=8,16"', "collect_sweep.py")),
    Entry(r"python scripts/collect_sweep\.py .*", "test",
          "tests/harness/test_configs.py::test_a_sweep_through_the_submitit_local_launcher_is_collected",
          ("collect_sweep.py",)),
    Entry(r"python run\.py .*shadow=.*", "test",
          "tests/harness/test_shadow.py::test_the_documented_shadow_run_keeps_the_tokens_and_names_its_shadow",
          ('"model=toy"', '"shadow=llamagen"', '"shadow.layers=1"', '"prompts.n=2"', '"eval=none"')),
    Entry(r"python scripts/gpu_check\.py --tiny .*", "test",
          "tests/bench/test_gpu_check.py::tiny_check",  # the module fixture every tiny-check test reads
          ('"scripts/gpu_check.py", "--tiny", "--device", "cpu"',)),
    Entry(r"python scripts/gpu_check\.py( .*)?", "exempt", "needs a CUDA device; its --tiny form runs in the tests"),
    Entry(r"python run\.py( .*)?", "run"),  # any toy run: defaults, overrides, experiments, --multirun sweeps
    Entry(r"python scripts/(paper_tables|audit|bench_bookkeeping|count_syncs|bench_engine|real_size)\.py( .*)?",
          "script"),
]  # fmt: skip

EXAMPLES = [
    "python run.py",
    "python run.py --multirun decoder.window=4,8",
    "python run.py --multirun hydra/launcher=local decoder.window=4,8",
    "torchrun --nproc_per_node=2 run.py",
    "python run.py hydra.run.dir=outputs/runs/my_run",
    "python run.py logger=wandb",
    "python run.py model=lumina",
    "python run.py experiment=sjd_lumina_coco5k",
    "python scripts/paper_tables.py",
    "python scripts/collect_sweep.py outputs/multirun/<sweep dir>",
    "python scripts/audit.py decoder=sjd",
    "make run",
    "make test",
]


def _normalise(line: str) -> str:
    line = re.sub(r"^\$\s+", "", line.strip())
    line = re.sub(r"\s+#.*$", "", line)  # a trailing shell comment
    line = re.sub(r"\s*\[[^\]]*\]", "", line)  # optional parts: [group=option ...]
    return " ".join(line.split())


def documented_commands() -> list[tuple[str, str]]:
    """(file:line, command) for every command line in a fenced block of README.md and docs/**/*.md."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        fenced, pending = False, ""
        for number, raw in enumerate(doc.read_text().splitlines(), 1):
            if raw.strip().startswith(("```", "~~~")):
                fenced, pending = not fenced, ""
                continue
            if not fenced:
                continue
            line = pending + raw.strip()
            if line.endswith("\\"):  # a command continued on the next line
                pending = line[:-1] + " "
                continue
            pending = ""
            command = _normalise(line)
            if command.startswith(PREFIXES):
                found.append((f"{doc.relative_to(ROOT)}:{number}", command))
    return found


def readme_setup() -> list[str]:
    """The lines of README.md's set-up block: the first fenced block after the `## Set-up` heading."""
    text = (ROOT / "README.md").read_text()
    heading = re.search(r"^## Set-up.*$", text, re.M)
    assert heading, "README.md has no '## Set-up' section"
    block = re.search(r"^```[a-z]*\n(.*?)^```", text[heading.end() :], re.M | re.S)
    assert block, "README.md's set-up section has no fenced block"
    return [_normalise(line) for line in block.group(1).splitlines() if _normalise(line)]


def shell_steps() -> list[str]:
    """The set-up steps a shell runs before a documented command: every one but the make steps,
    which readme_venv stands in for (and which must be exactly those it knows)."""
    setup = readme_setup()
    made = [line for line in setup if line.startswith("make")]
    assert tuple(made) == MAKE_STEPS, (
        f"README set-up builds the venv with {made}; readme_venv stands in for {MAKE_STEPS}"
    )
    return [line for line in setup if not line.startswith("make")]


def readme_venv(checkout: Path) -> Path:
    """`.venv/` in the checkout as `make` leaves it: the packages of the venv running the tests,
    and the checkout itself importable first, as its editable install makes it (see the docstring)."""
    venv = checkout / VENV
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "a_editable_checkout.pth").write_text(f"{checkout}\n")
    (site / "b_pinned_packages.pth").write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in ours))
    return venv


def entry_of(command: str) -> Entry | None:
    return next((e for e in REGISTRY if re.fullmatch(e.pattern, command)), None)


def test_every_documented_command_is_registered():
    unregistered = [f"{where}: {command}" for where, command in documented_commands() if entry_of(command) is None]
    assert not unregistered, (
        "documented commands without a test:\n  " + "\n  ".join(unregistered) + "\nRegister each in REGISTRY of "
        "tests/project/test_documented_commands.py: a regex of the command and how it is exercised (run, "
        "needs_weights, script, make, test with the test that covers it, or exempt with the reason)."
    )


def test_the_registry_refers_to_tests_that_show_the_documented_form():
    for entry in REGISTRY:
        if entry.how == "test":
            file, name = entry.note.split("::")
            source = (ROOT / file).read_text()
            assert f"def {name}(" in source, f"{entry.pattern}: {entry.note} does not exist"
            body = source[source.index(f"def {name}(") :]
            body = body[: (re.search(r"\n(def |@pytest)", body[1:]) or re.search("$", body)).start() + 1]
            missing = [s for s in entry.shows if s not in body]
            assert not missing, f"{entry.note} does not show {missing} of the documented {entry.pattern}"
        elif entry.how == "exempt":
            assert entry.note, f"{entry.pattern}: an exemption states its reason"


def _commands() -> list[str]:
    return list(dict.fromkeys([*EXAMPLES, *(c for _, c in documented_commands())]))


def _exercised(how: str) -> list[str]:
    return [c for c in _commands() if (e := entry_of(c)) is not None and e.how == how]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    copy = checkout_copy(tmp_path_factory.mktemp("docs") / "checkout")
    readme_venv(copy)
    return copy


def _argv(command: str, checkout: Path) -> list[str]:
    """The command as typed, placeholders filled in (`python` stays `python`: the shell finds it)."""
    args = shlex.split(
        command.replace("decoder=NAME", "decoder=sjd").replace("--nproc_per_node=N", "--nproc_per_node=2")
    )
    assert args[0] == "python", command
    return [a for a in args if a != "..."]


def _with_tiny(argv: list[str], tiny: dict[str, str] = TINY) -> list[str]:
    given = {a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a}
    return [*argv, *(f"{k}={v}" for k, v in tiny.items() if k not in given)]


def _run_in(
    checkout: Path, argv: list[str], timeout: float = 600, steps: list[str] | None = None
) -> subprocess.CompletedProcess:
    """`argv` in a bare shell in the checkout, after the README's set-up steps (`steps`)."""
    line = " && ".join([*(shell_steps() if steps is None else steps), shlex.join(argv)])
    return subprocess.run(
        ["bash", "-c", line], cwd=checkout, env=BARE_ENV, capture_output=True, text=True, timeout=timeout
    )


def _summaries(checkout: Path) -> set[Path]:
    return set((checkout / "outputs").rglob("summary.csv"))


_PASSED: set[tuple[str, ...]] = set()  # runs already exercised in this session, by run_key


def run_key(argv: list[str]) -> tuple[str, ...]:
    """What decides a documented run: the config it composes at tiny size, so that commands which spell out
    the defaults (`python run.py`, `python run.py decoder=sjd`, `python run.py model=toy decoder=sjd`, `make
    run`) run once, being the same run; a sweep by its command line (make's .venv/bin/python is the activated
    venv's python)."""
    overrides = _with_tiny(argv)[2:]
    if "--multirun" in overrides:
        return ("python", *argv[1:])
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        composed = OmegaConf.to_yaml(compose("config", overrides=overrides))
    GlobalHydra.instance().clear()
    return (composed,)


def exercise_run(command: str, argv: list[str], checkout: Path, steps: list[str] | None = None) -> None:
    key = run_key(argv)
    if key in _PASSED:
        return
    before = _summaries(checkout)
    proc = _run_in(checkout, _with_tiny(argv), steps=steps)
    assert proc.returncode == 0, f"{command}:\n{proc.stderr[-3000:]}"
    new = sorted(_summaries(checkout) - before)
    jobs = 1
    if "--multirun" in argv:  # one job per point of the sweep
        for a in argv:
            if "=" in a and "," in a.split("=", 1)[1] and not a.startswith("hydra"):
                jobs *= len(a.split("=", 1)[1].split(","))
    assert len(new) == jobs, f"{command}: {len(new)} summaries for {jobs} job(s)"
    for summary in new:
        rows = pd.read_csv(summary)
        assert len(rows) >= 2 and rows["n_prompts"].eq(2).all(), command
        if (summary.parent / ".hydra" / "config.yaml").read_text().count("fid:"):  # the toy eval is on
            assert rows["fid"].notna().all() and rows["clip"].notna().all(), command
    assert git(checkout, "status", "--porcelain") == "", f"{command} changed the checkout"
    _PASSED.add(key)


@pytest.mark.slow
@pytest.mark.parametrize("command", _exercised("run"))
def test_documented_run(command, checkout):
    exercise_run(command, _argv(command, checkout), checkout)


@pytest.mark.slow
@pytest.mark.parametrize("command", _exercised("make"))
def test_documented_make_target_runs_its_recipe(command, checkout):
    target = command.split()[1]
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, f"Makefile has no target {target}"
    lines = [x.strip() for x in recipe.group(1).splitlines()]
    assert len(lines) == 1 and lines[0].startswith("$(PY) run.py"), f"make {target}: {lines} is not a run.py command"
    # make runs its recipe with $(PY) = .venv/bin/python, not through an activated shell
    exercise_run(command, [f"{VENV}/bin/python", *shlex.split(lines[0])[1:]], checkout, steps=[])


def test_the_readme_set_up_enters_the_venv_it_builds():
    assert f"source {VENV}/bin/activate" in shell_steps(), readme_setup()


def test_the_activated_shell_imports_the_checkout_and_its_pinned_packages(checkout):
    """From scripts/ (where the script's own directory, not the checkout, leads sys.path), as
    `python scripts/...` runs: `sjd` is the checkout's, hydra and torch are the pinned packages."""
    probe = "import hydra, sjd, torch; print(sjd.__file__)"
    proc = _run_in(checkout, ["python", "-c", probe], steps=[*shell_steps(), "cd scripts"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert Path(proc.stdout.strip().splitlines()[-1]) == checkout / "sjd" / "__init__.py", proc.stdout


@pytest.mark.slow
def test_without_the_activation_the_documented_run_fails(checkout):
    """The control: the bare shell alone, without the README's activation step, cannot run
    `python run.py` (no python, or one without the packages), so nothing leaks from this process."""
    proc = _run_in(checkout, _with_tiny(["python", "run.py"]), steps=[], timeout=120)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert re.search(r"No module named|command not found", proc.stderr), proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("command", _exercised("needs_weights"))
def test_documented_real_model_command_stops_at_once_naming_the_missing_weights(command, checkout):
    proc = _run_in(checkout, _argv(command, checkout), timeout=300)
    assert proc.returncode != 0, command
    assert "model.adapter.weights" in proc.stderr, f"{command}:\n{proc.stderr[-3000:]}"
    assert re.search(r"could not load '[^']+'|not found", proc.stderr), proc.stderr[-3000:]  # the checkpoint it sought


@pytest.mark.slow
@pytest.mark.parametrize("command", _exercised("script"))
def test_documented_script(command, checkout):
    argv = _argv(command, checkout)
    argv += SCRIPT_ARGS.get(Path(argv[1]).name, [])
    proc = _run_in(checkout, argv)
    assert proc.returncode == 0, f"{command}:\n{proc.stderr[-3000:]}"
    if Path(argv[1]).name == "audit.py":
        report = json.loads(proc.stdout.strip().splitlines()[-1])  # the audit's report is its last line
        assert report["lossless_expected"] and 0 <= report["tv_distance"] <= 1, command
    assert git(checkout, "status", "--porcelain") == "", f"{command} changed the checkout"


def test_placeholders_and_optional_parts_are_filled_in():
    assert _normalise("$ torchrun --nproc_per_node=N run.py [key=value ...]   # data-parallel") == (
        "torchrun --nproc_per_node=N run.py"
    )
    assert _with_tiny(["python", "run.py", "prompts.n=8"]) == ["python", "run.py", "prompts.n=8",
                                                               "decoder.window=4", "warmup=0"]  # fmt: skip
    assert entry_of("python run.py model=lumina decoder=sjd").how == "needs_weights"
    assert entry_of("python run.py --multirun decoder.window=4,8,16").how == "run"
    assert entry_of("python scripts/no_such_script.py") is None
