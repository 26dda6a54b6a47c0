"""The package's layers, read from its source: imports go one way, from the tools down to the
pure logic, and only the backend (with the `check` tool) touches Horovod or mpi4py."""
import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hvd_dynbatch"
# What each sub-package may import from the others (errors.py, at the top, is shared by all).
ALLOWED = {
    "core": set(),
    "data": {"core"},
    "backend": {"core"},
    "training": {"core", "data", "backend"},
    "tools": {"core", "data", "backend", "training"},
}
# The third-party packages each layer may import (besides the standard library): setup.cfg's
# requirements, and torchvision where a GPU cluster has it (`training/models.py`).
THIRD_PARTY = {
    "core": {"numpy"},
    "data": {"numpy", "torch", "PIL"},
    "backend": {"numpy", "torch", "horovod", "mpi4py"},
    "training": {"numpy", "torch", "torchvision", "tqdm", "psutil"},
    "tools": {"numpy", "torch", "click", "matplotlib", "psutil", "tqdm", "horovod", "mpi4py"},
}
HOROVOD = {"horovod", "mpi4py"}


def imports(path: Path, source: str = None):
    """(the layer or top-level module of this package it names, or None; the third-party
    top-level name, or None) of every import in `path`, at any depth (imports inside
    functions count). Relative and absolute imports are read alike: `..core.x` from
    training/ and `hvd_dynbatch.core.x` both name core. `source`: the text to read as `path`'s
    (default: the file's)."""
    package = [PACKAGE.name, *path.parent.relative_to(PACKAGE).parts]
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield _named(alias.name.split("."), [])
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            yield _named([*base, *(node.module or "").split(".")],
                         [a.name for a in node.names])


def _named(parts, names):
    """The (layer, third-party name) of an import of `parts` (`from parts import names`)."""
    parts = [p for p in parts if p]
    if parts[0] != PACKAGE.name:
        return None, parts[0]
    return (parts[1] if len(parts) > 1 else names[0]), None


def modules():
    return sorted(p for p in PACKAGE.glob("*/*.py"))


@pytest.mark.parametrize("path", modules(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_imports_go_down_the_layers(path):
    layer = path.parent.name
    assert layer in ALLOWED, f"{layer}/ is not a known layer"
    for inner, outer in imports(path):
        if inner not in (None, layer, "errors"):
            assert inner in ALLOWED[layer], f"{layer}/{path.name} imports from {inner}/"
        if outer in HOROVOD:
            assert layer == "backend" or path.name == "check.py", \
                f"{layer}/{path.name} imports {outer}"
        if layer in THIRD_PARTY and outer is not None:
            assert outer in sys.stdlib_module_names or outer in THIRD_PARTY[layer], \
                f"{layer}/{path.name} imports {outer}"


@pytest.mark.parametrize("source, found", [
    ("import numpy.linalg", [(None, "numpy")]),
    ("from hvd_dynbatch.training.trainer import train", [("training", None)]),
    ("import hvd_dynbatch.backend.comm", [("backend", None)]),
    ("from hvd_dynbatch import errors", [("errors", None)]),
    ("def f():\n    from ..tools import cli", [("tools", None)]),
])
def test_every_form_of_import_is_read(tmp_path, source, found):
    assert list(imports(PACKAGE / "core" / "probe.py", source)) == found


def test_the_shared_modules_import_no_layer_but_the_pure_one():
    """errors.py is below every layer; the package's __init__ re-exports the pure logic only,
    so importing it starts neither torch nor Horovod."""
    for name, layers in (("errors.py", set()), ("__init__.py", {"core", "errors"})):
        for inner, outer in imports(PACKAGE / name):
            assert outer is None or outer in sys.stdlib_module_names, f"{name} imports {outer}"
            assert inner is None or inner in layers, f"{name} imports from {inner}"
