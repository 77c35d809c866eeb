"""service/core is pure: no stream framework, no storage, no event loop, no I/O of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import neardup.core

CORE = Path(neardup.core.__file__).parent
MODULES = sorted(CORE.rglob("*.py"))

FORBIDDEN_TOP_LEVEL = {
    # stream and storage frameworks: adapters live in service/stream and service/state
    "faust",
    "aiokafka",
    "kafka",
    "mode",
    "rocksdict",
    "asyncio",
    # network and process I/O
    "socket",
    "ssl",
    "http",
    "urllib",
    "requests",
    "subprocess",
    "multiprocessing",
    "selectors",
}
FORBIDDEN_SERVICE = ("neardup.state", "neardup.stream", "neardup.pipeline", "neardup.embedded", "neardup.cli")
FORBIDDEN_CALLS = {"open", "input", "print", "exec", "eval", "__import__"}


def imported_names(tree: ast.AST, module: Path) -> list[str]:
    """Absolute names of everything a module imports (relative imports resolved against neardup.core)."""
    package = [*neardup.core.__name__.split("."), *module.relative_to(CORE).parent.parts]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names.append(prefix)
            names.extend(f"{prefix}.{alias.name}" for alias in node.names)
    return names


def test_core_has_modules() -> None:
    names = {m.name for m in MODULES}
    assert {"normalize.py", "shingle.py", "minhash.py", "lsh.py", "dedup.py", "signing.py"} <= names


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.name)
def test_core_module_imports_nothing_impure(module: Path) -> None:
    tree = ast.parse(module.read_text(encoding="utf-8"), filename=str(module))
    for name in imported_names(tree, module):
        top = name.split(".")[0]
        assert top not in FORBIDDEN_TOP_LEVEL, f"{module.name} imports {name}"
        assert not name.startswith(FORBIDDEN_SERVICE), f"{module.name} imports {name} from outside the core"


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.name)
def test_core_module_does_no_io(module: Path) -> None:
    tree = ast.parse(module.read_text(encoding="utf-8"), filename=str(module))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in FORBIDDEN_CALLS, f"{module.name}:{node.lineno} calls {node.func.id}()"
        if isinstance(node, ast.Attribute) and node.attr in {
            "read_text",
            "read_bytes",
            "write_text",
            "write_bytes",
        }:
            pytest.fail(f"{module.name}:{node.lineno} does file I/O (.{node.attr})")
        assert not isinstance(node, ast.AsyncFunctionDef | ast.Await), f"{module.name} is async"


def test_the_checker_catches_violations() -> None:
    """The checks above must be able to fail: run them on a deliberately impure module."""
    fake = CORE / "impure_example.py"
    source = "import asyncio\nfrom ..state import rocks\nfrom rocksdict import Rdict\n"
    names = imported_names(ast.parse(source), fake)
    assert "asyncio" in names and "neardup.state.rocks" in names and "rocksdict.Rdict" in names
    assert "neardup.core.lsh.band_keys" in imported_names(ast.parse("from .lsh import band_keys"), fake)
