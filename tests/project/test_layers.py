"""The package's imports go down the layer order of docs/design.md §9, and never in a circle.

Every `import` and `from ... import` in `sjd/` is read with `ast`, at module level and inside
functions alike (a deferred import is still a dependency), and mapped to the top-level unit it
names: `sjd.core`, `sjd.models`, `sjd.types`, ... A unit may import units of its own layer or
below; among units of one layer the imports must not form a cycle.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sjd"

# docs/design.md §9, bottom to top. `sjd` is the package's own __init__.py.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("sjd", "types", "torchvision_compat"),
    ("core", "toy"),
    ("models",),
    ("drafters",),
    ("decoders", "sjd2", "standin", "eval"),
    ("audit",),
    ("harness", "training", "bench"),
)
LAYER_OF = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def unit_of(path: Path) -> str:
    """The top-level unit a file of sjd/ belongs to: the subpackage, the module, or `sjd` itself."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return "sjd" if parts == ("__init__",) else parts[0]


def module_of(path: Path, root: Path) -> list[str]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_units(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, unit) for every sjd unit that the file `root`/sjd/... imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = module_of(path, root)
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = here if is_package else here[:-1]
                base = base[: len(base) - (node.level - 1)]
            else:
                base = []
            module = base + (node.module.split(".") if node.module else [])
            # `from sjd import types` names the unit in the imported names
            names = [module + [alias.name] for alias in node.names] if module == ["sjd"] else [module]
        else:
            continue
        for name in names:
            if name and name[0] == "sjd":
                found.append((node.lineno, name[1] if len(name) > 1 else "sjd"))
    return found


def edges() -> list[tuple[str, str, str]]:
    """(importing unit, imported unit, file:line) across units."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = unit_of(path)
        for line, target in imported_units(path):
            if target != source:
                out.append((source, target, f"{path.relative_to(ROOT)}:{line}"))
    return out


def test_every_unit_of_the_package_has_a_layer():
    units = {unit_of(p) for p in PACKAGE.rglob("*.py")}
    missing = sorted(units - set(LAYER_OF))
    assert not missing, f"sjd/ units with no place in the layer order (docs/design.md §9): {missing}"


def test_imports_only_go_down_the_layer_order():
    upward = [
        f"{where}: sjd.{source} (layer {LAYER_OF[source]}) imports sjd.{target} (layer {LAYER_OF[target]})"
        for source, target, where in edges()
        if source in LAYER_OF and target in LAYER_OF and LAYER_OF[target] > LAYER_OF[source]
    ]
    assert not upward, "imports up the layer order:\n" + "\n".join(upward)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt, stack)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node, [])):
            return cycle
    return None


def test_the_units_import_each_other_without_a_cycle():
    graph: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], str] = {}
    for source, target, at in edges():
        graph[source].add(target)
        graph[target]
        where.setdefault((source, target), at)
    cycle = find_cycle(graph)
    assert cycle is None, (
        "import cycle between units: "
        + " -> ".join(f"sjd.{u}" for u in cycle)
        + (" (" + ", ".join(where[a, b] for a, b in zip(cycle, cycle[1:])) + ")")
    )


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from sjd.core.verify import verify\n", ["core"]),
        ("def f():\n    import sjd.harness.runner as r\n", ["harness"]),
        ("from sjd import types\n", ["types"]),
        ("from . import relaxed_rules\n", ["core"]),
        ("from ..models import base\n", ["models"]),
        ("import torch\n", []),
    ],
)
def test_the_walk_sees_every_form_of_import(tmp_path, source, expected):
    """The walk must see module-level, deferred, `from sjd import` and relative imports."""
    module = tmp_path / "sjd" / "core" / "example.py"
    module.parent.mkdir(parents=True)
    module.write_text(source)
    assert [unit for _, unit in imported_units(module, tmp_path)] == expected


def test_the_cycle_finder_finds_a_cycle_and_passes_a_chain():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_library_never_imports_the_studies():
    """studies/ (results pages, regime map, paper tables) sits above the library: it reads sjd/, never the reverse."""
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])  # fmt: skip
            upward += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names if n.split(".")[0] == "studies"]
    assert not upward, f"sjd/ imports studies/: {upward}"
