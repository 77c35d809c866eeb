"""Every exception neardup defines is a neardup.Error: `except neardup.Error` catches them all."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from pathlib import Path

import pytest

import neardup
from neardup.errors import Error

SERVICE = Path(neardup.__file__).parent
# Run as a script, it would start the command line.
NOT_IMPORTED = {SERVICE / "__main__.py"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SERVICE).with_suffix("").parts
    return ".".join(["neardup", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def top_level_classes(tree: ast.Module) -> list[str]:
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)]


def nested_exception_classes(tree: ast.Module) -> list[str]:
    """Classes defined below module level (they cannot be imported) whose bases name an exception."""
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef) or id(node) in top:
            continue
        names = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
        if any(_names_an_exception(name) for name in names):
            found.append(node.name)
    return found


def _names_an_exception(name: str) -> bool:
    known = getattr(builtins, name, None)
    is_builtin = isinstance(known, type) and issubclass(known, BaseException)
    return is_builtin or name.endswith(("Error", "Exception", "Failed", "Fault"))


MODULES = sorted(p for p in SERVICE.rglob("*.py") if p not in NOT_IMPORTED)
TREES = {path: ast.parse(path.read_text(encoding="utf-8")) for path in MODULES}


def exception_classes() -> list[type[BaseException]]:
    found = []
    for path, tree in TREES.items():
        module = importlib.import_module(module_name(path))
        for name in top_level_classes(tree):
            cls = getattr(module, name)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                found.append(cls)
    return found


EXCEPTIONS = exception_classes()


@pytest.mark.parametrize("cls", EXCEPTIONS, ids=lambda cls: f"{cls.__module__}.{cls.__name__}")
def test_every_exception_is_a_neardup_error(cls: type[BaseException]) -> None:
    assert issubclass(cls, neardup.Error), f"{cls.__module__}.{cls.__name__} is not a neardup.Error"


def test_the_walk_finds_them() -> None:
    names = {cls.__name__ for cls in EXCEPTIONS}
    assert {"Error", "InvalidMessage", "ChildTimedOut", "TopicMismatch", "StateError"} <= names
    assert len(names) >= 15


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SERVICE)))
def test_no_exception_is_defined_out_of_reach(path: Path) -> None:
    assert nested_exception_classes(TREES[path]) == []


def test_the_tree_in_neardup_errors_names_every_exception() -> None:
    """The one place that documents them, with each one's bases."""
    tree = importlib.import_module("neardup.errors").__doc__ or ""
    drawn = dict(re.findall(r"[├└]── (\w+)(?: \((\w+)\))?", tree))
    for cls in EXCEPTIONS:
        if cls is Error:
            continue
        assert cls.__name__ in drawn, f"{cls.__module__}.{cls.__name__} is not in neardup.errors' tree"
        builtin = drawn[cls.__name__]
        assert not builtin or issubclass(cls, getattr(builtins, builtin)), cls.__name__


def test_the_nested_check_can_fail() -> None:
    tree = ast.parse("def f():\n    class Oops(ValueError): ...\n    class Fine(dict): ...\n")
    assert nested_exception_classes(tree) == ["Oops"]


def test_the_root_and_the_exported_ones() -> None:
    assert neardup.Error is Error and issubclass(Error, Exception)
    exported = [getattr(neardup, name) for name in neardup.__all__]
    errors = {cls.__name__ for cls in exported if isinstance(cls, type) and issubclass(cls, BaseException)}
    user_facing = {"ConfigError", "CorruptRecord", "DecisionFailed", "IncompatibleState", "InvalidMessage"}
    user_facing.add("StateError")
    assert errors == {"Error", *user_facing}


def test_built_in_bases_are_kept() -> None:
    assert issubclass(neardup.InvalidMessage, ValueError)
    assert issubclass(neardup.ConfigError, ValueError)
    assert issubclass(neardup.CorruptRecord, ValueError)
    with pytest.raises(ValueError):
        raise neardup.InvalidMessage("schema_violation", "still a ValueError")
