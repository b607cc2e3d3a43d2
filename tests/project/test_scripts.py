"""Every script under scripts/ is a command line over the package: at most LIMIT lines, its work done by a function
of sjd/ or studies/ that tests import, and every name it imports from there exists (few tests run the scripts)."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))
LIMIT = 80
PACKAGES = ("sjd", "studies")


def test_every_script_is_a_thin_command_line():
    longer = sorted(p.name for p in SCRIPTS if len(p.read_text().splitlines()) > LIMIT)
    assert not longer, f"over {LIMIT} lines: {longer}"


def package_imports(script: Path) -> list[tuple[str, str | None]]:
    """(module, name) of every `from sjd... import name` and (module, None) of every `import sjd...`."""
    out = []
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
            out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] in PACKAGES]
    return out


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_name_a_script_imports_from_the_package_exists(script):
    missing = []
    for module_name, name in package_imports(script):
        module = importlib.import_module(module_name)
        if name is None or hasattr(module, name):
            continue
        try:
            importlib.import_module(f"{module_name}.{name}")  # a submodule: `from sjd.core import sampling`
        except ModuleNotFoundError:
            missing.append(f"{module_name}.{name}")
    assert not missing, f"{script.name} imports names the package lacks: {missing}"
