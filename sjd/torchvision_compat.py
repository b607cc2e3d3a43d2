"""Make torchvision importable on a CPU-only torch.

PyPI's torchvision wheel pinned to torch 2.13.0 is a CUDA build. On the `+cpu` torch its C++ ops
(`torchvision/_C.so`, linked against libtorch_cuda) never load, and torchvision then registers
fake kernels for `torchvision::nms` and `torchvision::qnms` without checking that the ops exist,
so `import torchvision` dies with "operator torchvision::nms does not exist". Everything that
imports torchvision inherits that: open_clip, timm, torchmetrics (which imports torchvision
whenever it is installed) and transformers' model classes.

The fix: when torchvision's `__init__` fails that way, declare the two op schemas (no kernels),
drop the half-imported submodules and run it again. The python side of torchvision (transforms,
model definitions) then works; only its compiled ops (`torchvision.ops.nms`, ...) raise, and no
code here uses them. Where torchvision imports fine (a CUDA torch, or a CPU torchvision build)
the first run succeeds and nothing is changed.

torchmetrics and transformers import torchvision by themselves, so the fix has to be in place
before either is imported, not only before open_clip: `sjd/__init__.py` installs it as an import
hook. The hook imports nothing until something imports torchvision.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

# The ops torchvision's fake-kernel registrations name without checking that they exist, with the
# schemas of torchvision's own C++ definitions.
_OP_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_declared_ops = None  # the torch.library.Library holding them; it drops its definitions when collected


def _failed_on_missing_ops(error: RuntimeError) -> bool:
    return "torchvision::" in str(error) and "does not exist" in str(error)


def _declare_missing_ops() -> None:
    global _declared_ops
    import torch

    if _declared_ops is None:
        _declared_ops = torch.library.Library("torchvision", "DEF")
        for schema in _OP_SCHEMAS:
            _declared_ops.define(schema)


class _RetryWithDeclaredOps(importlib.abc.Loader):
    """torchvision's own loader, with one retry after declaring the ops its import needs."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def __getattr__(self, name: str):  # get_filename, is_package, resource readers: the real loader's
        if name == "_loader":  # not set yet (a copy made without __init__): no endless recursion
            raise AttributeError(name)
        return getattr(self._loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        except RuntimeError as e:
            if not _failed_on_missing_ops(e):
                raise
            # submodules imported before the failure are half-initialised; the retry imports them anew
            for name in [n for n in sys.modules if n.startswith("torchvision.")]:
                del sys.modules[name]
            _declare_missing_ops()
            self._loader.exec_module(module)


class _TorchvisionFinder(importlib.abc.MetaPathFinder):
    """Finds torchvision through the other finders and wraps its loader."""

    def find_spec(self, fullname: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torchvision":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RetryWithDeclaredOps(spec.loader)
                return spec
        return None


def install_torchvision_import_fix() -> None:
    """Put the hook first on sys.meta_path (once). Imports nothing."""
    if not any(isinstance(f, _TorchvisionFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionFinder())


def import_torchvision() -> ModuleType:
    """`import torchvision` with the fix in place; a clear error where it is not installed."""
    install_torchvision_import_fix()
    try:
        import torchvision
    except ModuleNotFoundError as e:
        if e.name != "torchvision":
            raise
        raise ModuleNotFoundError(
            "torchvision is not installed; it comes with the eval extra: pip install -e '.[eval]' (or make install)"
        ) from e
    return torchvision
