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
THIRD_PARTY = {
    "core": {"numpy"},
    "data": {"numpy", "torch", "PIL", "sklearn"},
}
HOROVOD = {"horovod", "mpi4py"}


def imports(path: Path):
    """(the layer or top-level module of this package it names, or None; the third-party
    top-level name, or None) of every import in `path`, at any depth (imports inside
    functions count)."""
    layer = path.parent.name
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield None, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield None, node.module.split(".")[0]
            elif node.level == 1:
                yield layer, None
            else:
                yield (node.module or node.names[0].name).split(".")[0], None


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
