"""Text that cannot drift: every repository path that README.md, docs/ or a docstring or comment in sjd/
names exists.

A path is a word rooted at a top-level folder of the repository (`sjd/harness/runner.py`,
`conf/model/toy.yaml`, `results/studies/x.csv`, `docs/design.md`, `sjd/toy/`), or, in a markdown file,
the target of a relative link (`[design](design.md)`); in a markdown file both may be read from the
file's own folder (docs/ names `results/regime_map.md`, which is docs/results/regime_map.md). Exempt: run
outputs (`outputs/...`), and globs and placeholders (`conf/decoder/*.yaml`, `results/paper/<table>.csv`,
`results/studies/NAME.csv`, `{...}`, `...`). A markdown page named without its folder (`algorithms.md`)
must be the name of a page somewhere in the repository, and a dotted module name (`sjd.harness.runner`,
`sjd.core.sampling.logits_to_probs`) must lead down the packages to a module. The walk-throughs
(docs/adding-a-decoder.md, docs/adding-a-model.md) are exempt: they name the files the reader is about
to create.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

import pytest

from sjd.harness.decoder_configs import algorithm_configs

ROOT = Path(__file__).resolve().parents[2]
ROOTS = ("sjd", "conf", "scripts", "tests", "results", "docs", "experiments")
WALK_THROUGHS = {"docs/adding-a-decoder.md", "docs/adding-a-model.md"}
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(ROOTS)})/[^\s`'\"()\[\],;:]*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
BARE_PAGE = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")  # a page named without its folder: `algorithms.md`
MODULE = re.compile(r"(?<![\w./-])(sjd(?:\.\w+)+)")  # sjd.harness.runner, sjd.core.sampling.logits_to_probs
PLACEHOLDER = re.compile(r"[*<>{}]|\.\.\.|\bNAME\b|\bN\b")


def candidates(text: str) -> list[str]:
    """The repository paths a piece of text names, without trailing punctuation."""
    found = []
    for match in PATH.finditer(text):
        path = match.group(1).split("#")[0].rstrip(".")  # a link's #anchor names a heading, not a file
        if path and not PLACEHOLDER.search(path):
            found.append(path)
    return found


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


def missing_in(text: str, base: Path) -> list[str]:
    """Paths named in `text` that are not in the repository, from its root or from the folder `base` of
    the markdown file (where its links resolve)."""
    missing = [p for p in candidates(text) if not (ROOT / p).exists() and not (base / p).exists()]
    for target in LINK.findall(text):
        target = target.split("#", 1)[0]
        if not target or re.match(r"^[a-z]+:", target) or PLACEHOLDER.search(target):
            continue
        resolved = (base / target).resolve()
        if resolved.is_relative_to(ROOT) and resolved.relative_to(ROOT).parts[:1] == ("outputs",):
            continue
        if not resolved.exists():
            missing.append(target)
    return missing + unknown_pages(LINK.sub("]", text)) + unknown_modules(text)


def docs_and_readme() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [f for f in files if f.relative_to(ROOT).as_posix() not in WALK_THROUGHS]


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
    missing = missing_in(doc.read_text(encoding="utf-8"), doc.parent)
    assert not missing, f"{doc.relative_to(ROOT)} names {missing}, which are not in the repository"


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


def test_the_readme_names_every_decoder_config():
    """The README's `decoder` row lists every algorithm config in conf/decoder/, so a new decoder is not left out of
    it (the variants are those with other settings, sjd/harness/decoder_configs.py)."""
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `decoder` |"))
    listed = set(re.findall(r"`(\w+)`", row.split("|")[2]))
    configs = set(algorithm_configs())
    assert configs - listed == set(), f"README.md's decoder row misses {sorted(configs - listed)}"
