"""Text that cannot drift: every repository path that README.md, docs/, experiments/README.md or a docstring or
comment in sjd/ names exists, and every test the docs name is a test of the suite.

A path is a word rooted at a top-level folder of the repository (`sjd/harness/runner.py`,
`conf/model/toy.yaml`, `results/studies/x.csv`, `docs/design.md`, `studies/pages.py`, `sjd/toy/`), a
top-level file named in backticks (`Makefile`, `run.py`, `pyproject.toml`, and the usual names of files
this repository does not have, such as `setup.py`), or, in a markdown file, the target of a relative link
(`[design](design.md)`); in a markdown file both may be read from the file's own folder (docs/ names
`results/regime_map.md`, which is docs/results/regime_map.md). Exempt: run outputs (`outputs/...`) and
placeholders (`results/paper/<table>.csv`, `results/studies/NAME.csv`, `{...}`, `...`). A glob
(`conf/decoder/*.yaml`) must match at least one file. A markdown page named without its folder
(`algorithms.md`) must be the name of a page somewhere in the repository, and a dotted module name
(`sjd.harness.runner`, `sjd.core.sampling.logits_to_probs`) must lead down the packages to a module. The
walk-throughs (docs/adding-a-decoder.md, docs/adding-a-model.md) may also name the files they show the
reader how to write: a path named in the paragraph just above a code block, and its module.

A test named in backticks (`test_greedy_decoder_equals_greedy_ar`, or `tests/x.py::test_y`) must be a
`def test_...` somewhere under tests/, in the hand-written docs: README.md, experiments/README.md and docs/
without the results pages `make docs` generates.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sjd.harness.decoder_configs import algorithm_configs

ROOT = Path(__file__).resolve().parents[2]
ROOTS = ("sjd", "conf", "scripts", "tests", "results", "docs", "experiments", "studies")
# Files a doc means at the top level when it names them bare: ours, and the usual ones this repository has not.
TOP_LEVEL = ("Makefile", "run.py", "pyproject.toml", "setup.py", "setup.cfg", "requirements.txt", "environment.yml")
WALK_THROUGHS = {"docs/adding-a-decoder.md", "docs/adding-a-model.md"}
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(ROOTS)})/[^\s`'\"()\[\],;:]*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
BARE_PAGE = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")  # a page named without its folder: `algorithms.md`
MODULE = re.compile(r"(?<![\w./-])(sjd(?:\.\w+)+)")  # sjd.harness.runner, sjd.core.sampling.logits_to_probs
PLACEHOLDER = re.compile(r"[*<>{}]|\.\.\.|\bNAME\b|\bN\b")
GLOB_ONLY = re.compile(r"[<>{}]|\.\.\.|\bNAME\b|\bN\b")  # a placeholder other than a glob's `*`
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
CODE = re.compile(r"`([^`\n]+)`")
TEST_NAME = re.compile(r"test_\w+")
SHOWN = re.compile(r"(?:^|\n\n)((?:(?!\n\n).)+)\n\n```", re.S)  # the paragraph just above a code block


def candidates(text: str) -> list[str]:
    """The repository paths a piece of text names, without trailing punctuation."""
    found = []
    for match in PATH.finditer(text):
        path = match.group(1).split("#")[0].rstrip(".")  # a link's #anchor names a heading, not a file
        if path and not PLACEHOLDER.search(path):
            found.append(path)
    return found


def code_words(text: str) -> list[str]:
    """The words of a markdown text's inline code spans (`python run.py model=toy` gives three), without the
    punctuation around them; fenced blocks are code to run, not citations, and are left out."""
    words = []
    for span in CODE.findall(FENCE.sub("", text)):
        words += [w.strip(".,;:()[]'\"") for w in span.split()]
    return [w for w in words if w]


def cited_tests(text: str) -> list[str]:
    """The test functions a markdown text names in backticks: `test_x`, or the test of `tests/a.py::test_x` and
    `tests/a.py::TestA::test_x[case]`."""
    names = [part.split("[")[0] for word in code_words(text) for part in word.split("::")]
    return [n for n in names if TEST_NAME.fullmatch(n) and not PLACEHOLDER.search(n)]


@functools.cache
def defined_tests() -> frozenset[str]:
    """Every `def test_...` under tests/, module-level functions and contract methods alike."""
    found = set()
    for source in sorted((ROOT / "tests").rglob("*.py")):
        found |= set(re.findall(r"^\s*(?:async\s+)?def (test_\w+)", source.read_text(encoding="utf-8"), re.M))
    return frozenset(found)


def unknown_tests(text: str) -> list[str]:
    return [name for name in cited_tests(text) if name not in defined_tests()]


def missing_top_level(text: str) -> list[str]:
    """Top-level files a markdown text names bare in backticks (`Makefile`, `setup.py`) that are not there."""
    return [w for w in code_words(text) if w in TOP_LEVEL and not (ROOT / w).is_file()]


def unmatched_globs(text: str, base: Path) -> list[str]:
    """Globs (`conf/decoder/*.yaml`) that match no file, from the repository root or from `base`."""
    unmatched = []
    for match in PATH.finditer(text):
        glob = match.group(1).split("#")[0].rstrip(".")
        if "*" in glob and not GLOB_ONLY.search(glob):
            if not any(ROOT.glob(glob)) and not any(base.glob(glob)):
                unmatched.append(glob)
    return unmatched


def shown_files(text: str) -> set[str]:
    """The files a walk-through shows the reader how to write: the paths named in the paragraph just above a
    code block (`sjd/decoders/fresh_sjd.py`:, Its YAML, `conf/decoder/fresh_sjd.yaml`:)."""
    return {path for paragraph in SHOWN.findall(text) for path in candidates(paragraph)}


def shown_module(name: str, shown: set[str]) -> bool:
    """Whether a dotted name leads into a module a walk-through shows (`sjd.decoders.fresh_sjd.FreshDraftDecoder`)."""
    parts = name.split(".")
    return any("/".join(parts[:k]) + ".py" in shown for k in range(2, len(parts) + 1))


@functools.cache
def page_names() -> frozenset[str]:
    skip = {".git", ".venv", "outputs"}
    return frozenset(p.name for p in ROOT.rglob("*.md") if not skip & set(p.relative_to(ROOT).parts))


def unknown_pages(text: str) -> list[str]:
    """Markdown pages named without a folder (`ecosystem.md`) that no folder of the repository holds."""
    return [name for name in BARE_PAGE.findall(text) if name not in page_names()]


def is_module_path(dotted: str) -> bool:
    """Whether `sjd.a.b...` walks down packages to a module (what follows a module is its attributes),
    or ends at a name its package's __init__.py defines."""
    here = ROOT / "sjd"
    for part in dotted.split(".")[1:]:
        if (here / part).is_dir():
            here = here / part
            continue
        if (here / f"{part}.py").is_file():
            return True
        init = here / "__init__.py"
        defined = re.compile(rf"^(def|class) {part}\b|^{part}\s*=", re.M)
        return init.is_file() and defined.search(init.read_text()) is not None
    return True


def unknown_modules(text: str) -> list[str]:
    return [name for name in MODULE.findall(text) if not is_module_path(name)]


def missing_in(text: str, base: Path, shown: frozenset[str] = frozenset()) -> list[str]:
    """Paths named in `text` that are not in the repository, from its root or from the folder `base` of
    the markdown file (where its links resolve), and are not among the files a walk-through `shown`."""
    missing = [p for p in candidates(text) if not (ROOT / p).exists() and not (base / p).exists()]
    missing = [p for p in missing if p not in shown] + unmatched_globs(text, base) + missing_top_level(text)
    for target in LINK.findall(text):
        target = target.split("#", 1)[0]
        if not target or re.match(r"^[a-z]+:", target) or PLACEHOLDER.search(target):
            continue
        resolved = (base / target).resolve()
        if resolved.is_relative_to(ROOT) and resolved.relative_to(ROOT).parts[:1] == ("outputs",):
            continue
        if not resolved.exists():
            missing.append(target)
    modules = [m for m in unknown_modules(text) if not shown_module(m, shown)]
    return missing + unknown_pages(LINK.sub("]", text)) + modules


def docs_and_readme() -> list[Path]:
    return [ROOT / "README.md", ROOT / "experiments" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def generated(doc: Path) -> bool:
    """A results page `make docs` writes (docs/results/), which says so at its top."""
    head = doc.read_text(encoding="utf-8")[:2000]
    return doc.parent == ROOT / "docs" / "results" and "Generated by" in head and "do not edit by hand" in head


def docstrings_and_comments(source: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment of a Python source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    found.append((body[0].lineno, body[0].value.value))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
    return found


@pytest.mark.parametrize("doc", docs_and_readme(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_docs_name_only_files_that_exist(doc: Path):
    text = doc.read_text(encoding="utf-8")
    shown = frozenset(shown_files(text)) if doc.relative_to(ROOT).as_posix() in WALK_THROUGHS else frozenset()
    missing = missing_in(text, doc.parent, shown)
    assert not missing, f"{doc.relative_to(ROOT)} names {missing}, which are not in the repository"


@pytest.mark.parametrize(
    "doc", [d for d in docs_and_readme() if not generated(d)], ids=lambda p: p.relative_to(ROOT).as_posix()
)
def test_the_docs_name_only_tests_that_exist(doc: Path):
    unknown = unknown_tests(doc.read_text(encoding="utf-8"))
    assert not unknown, f"{doc.relative_to(ROOT)} names {unknown}, which no `def` under tests/ defines"


def test_docstrings_and_comments_in_sjd_name_only_files_that_exist():
    stale = []
    for module in sorted((ROOT / "sjd").rglob("*.py")):
        for line, text in docstrings_and_comments(module.read_text(encoding="utf-8")):
            named = [p for p in candidates(text) if not (ROOT / p).exists()] + unknown_pages(text)
            named += unknown_modules(text)
            stale += [f"{module.relative_to(ROOT)}:{line}: {p}" for p in named]
    assert not stale, "docstrings or comments name files that are not in the repository:\n" + "\n".join(stale)


def test_the_check_sees_a_stale_path_and_lets_placeholders_and_outputs_pass(tmp_path):
    text = (
        "See sjd/harness/runner.py, `conf/model/toy.yaml`, sjd/toy/ and [design](design.md). "
        "Not sjd/harness/runs.py, nor docs/ecosystem.md, nor [gone](gone.md). "
        "Placeholders: conf/decoder/*.yaml, results/paper/<table>.csv, results/studies/NAME.csv, results/...csv; "
        "outputs/runs.csv and [a run](../outputs/runs.csv) are run outputs."
    )
    assert missing_in(text, ROOT / "docs") == ["sjd/harness/runs.py", "docs/ecosystem.md", "gone.md"]
    assert unknown_pages("as algorithms.md §2 and README.md say, not ecosystem.md §3") == ["ecosystem.md"]
    modules = "sjd.harness.runner.run, sjd.core.sampling, sjd.decoders, sjd.models.standin_gone, sjd.core.nothing.f"
    assert unknown_modules(modules) == ["sjd.models.standin_gone", "sjd.core.nothing.f"]
    source = '"""Reads sjd/core/verify.py."""\n\nx = 1  # and sjd/core/nothing.py\n'
    assert [p for _, text in docstrings_and_comments(source) for p in candidates(text)] == [
        "sjd/core/verify.py",
        "sjd/core/nothing.py",
    ]


def test_the_check_sees_a_test_a_top_level_file_and_a_glob_that_are_not_there():
    text = (
        "Greedy AR is held to `test_greedy_ar_equals_the_librarys_generate` and, by "
        "`tests/decoders/test_decoders.py::test_greedy_sjd_equals_greedy_ar_token_for_token`, to SJD; not by "
        "`test_greedy_ar_equals_the_release_generate_loop` nor `tests/x.py::test_nothing_here`. Your "
        "`test_adapter_<name>` is a placeholder, `test_lumina_mgpt.py` another repository's file, and "
        "`tests/models/test_adapter_micro.py::TestMicroAdapter::test_gone[sjd4]` is gone.\n\n"
        "```python\ndef test_a_skeleton_the_reader_writes(): ...\n```\n"
    )
    assert unknown_tests(text) == ["test_greedy_ar_equals_the_release_generate_loop", "test_nothing_here", "test_gone"]
    top = "`make run` reads the `Makefile`; `pip install -e .` reads `pyproject.toml`, not `setup.py`."
    assert missing_top_level(top) == ["setup.py"]
    globs = "`conf/decoder/*.yaml`, `tests/models/test_adapter_*.py`, not `tests/test_adapter_*.py`."
    assert unmatched_globs(globs, ROOT / "docs") == ["tests/test_adapter_*.py"]
    assert missing_in(globs + " " + top, ROOT / "docs") == ["tests/test_adapter_*.py", "setup.py"]
    walk = (
        "Write it in `sjd/decoders/mine.py`:\n\n```python\nx = 1\n```\n\nIts YAML, `conf/decoder/mine.yaml`:\n\n"
        "```yaml\n_target_: sjd.decoders.mine.MyDecoder\n```\n\nThen `sjd/decoders/mine.py` runs; "
        "`sjd/decoders/theirs.py` and sjd.decoders.theirs.X are not there."
    )
    shown = frozenset(shown_files(walk))
    assert shown == {"sjd/decoders/mine.py", "conf/decoder/mine.yaml"}
    assert missing_in(walk, ROOT / "docs", shown) == ["sjd/decoders/theirs.py", "sjd.decoders.theirs.X"]
    outside = set(missing_in(walk, ROOT / "docs"))  # outside a walk-through, a file it shows is missing
    assert outside == {*shown, "sjd/decoders/theirs.py", "sjd.decoders.mine.MyDecoder", "sjd.decoders.theirs.X"}


def test_the_readme_names_every_decoder_config():
    """The README's `decoder` row lists every algorithm config in conf/decoder/, so a new decoder is not left out of
    it (the variants are those with other settings, sjd/harness/decoder_configs.py)."""
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `decoder` |"))
    listed = set(re.findall(r"`(\w+)`", row.split("|")[2]))
    configs = set(algorithm_configs())
    assert configs - listed == set(), f"README.md's decoder row misses {sorted(configs - listed)}"


def test_experiments_readme_lists_every_study_overlay():
    """experiments/README.md has a row for every overlay in conf/experiment/ that pins a study (a `study:` key),
    so a study a page shows is never missing from the list a reader starts at."""
    listed = set(re.findall(r"^\| (\w+) \|", (ROOT / "experiments" / "README.md").read_text(), re.M))
    studies = {p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml") if OmegaConf.load(p).get("study")}
    assert studies - listed == set(), f"experiments/README.md has no row for {sorted(studies - listed)}"
