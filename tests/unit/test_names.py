"""One name, one meaning: no two classes or type aliases of the package share a name, so that a
name read anywhere in service/ says which thing it is."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import neardup

SERVICE = Path(neardup.__file__).parent


def defined_names(source: str) -> list[str]:
    """The classes and type aliases (a capitalised name bound at module level to a type, not a
    CONSTANT) a module defines."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id[:1].isupper() and not target.id.isupper():
                names.append(target.id)
    return names


def test_no_two_classes_or_type_aliases_share_a_name() -> None:
    where: dict[str, list[str]] = collections.defaultdict(list)
    for module in sorted(SERVICE.rglob("*.py")):
        for name in defined_names(module.read_text(encoding="utf-8")):
            where[name].append(str(module.relative_to(SERVICE)))
    shared = {name: modules for name, modules in where.items() if len(modules) > 1}
    assert shared == {}, shared


def test_the_check_sees_classes_and_aliases() -> None:
    source = "class Marker: ...\nSettle = tuple[int, int]\nLIMIT = 3\nPosition = 'x'\n"
    assert defined_names(source) == ["Marker", "Settle", "Position"]
