"""No test module imports another test module, and nothing imports a conftest.py: what tests share
lives in tests/support/, and fixtures come from a conftest by pytest's injection, never by import
(a conftest imported by name is a second copy of it, beside the one pytest loaded)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def imported(source: str, path: Path) -> set[Path]:
    """The files under tests/ that `source`, the text of `path`, imports, resolved as Python would
    from the repository root (absolute imports) or from its own package (relative ones)."""
    package = path.parent.relative_to(ROOT).parts
    found = set()
    for node in ast.walk(ast.parse(source, str(path))):
        names: list[tuple[str, ...]] = []
        if isinstance(node, ast.Import):
            names = [tuple(alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = (*base, *(node.module or "").split(".")) if node.module else base
            names = [module, *((*module, alias.name) for alias in node.names)]
        for parts in names:
            target = ROOT.joinpath(*parts).with_suffix(".py")
            if parts and parts[0] == "tests" and target.is_file():
                found.add(target)
    return found


def test_no_test_module_imports_another() -> None:
    offenders = {
        f"{path.relative_to(ROOT)} imports {target.relative_to(ROOT)}"
        for path in TESTS.rglob("*.py")
        for target in imported(path.read_text(), path)
        if target.name.startswith("test_") and target != path
    }
    assert not offenders, sorted(offenders)


def test_no_module_imports_a_conftest() -> None:
    """Plain helpers (constants, classes, functions) live in tests/support/; a conftest only holds
    fixtures and hooks, which pytest finds itself."""
    offenders = {
        f"{path.relative_to(ROOT)} imports {target.relative_to(ROOT)}"
        for path in TESTS.rglob("*.py")
        for target in imported(path.read_text(), path)
        if target.name == "conftest.py"
    }
    assert not offenders, sorted(offenders)


def test_the_check_sees_every_form_of_import() -> None:
    """Absolute, relative, and a module named in a from-import: each is found."""
    here = TESTS / "integration" / "test_example_only.py"
    forms = {
        "import tests.unit.test_stages": TESTS / "unit" / "test_stages.py",
        "from tests.unit.test_fuzz import x": TESTS / "unit" / "test_fuzz.py",
        "from tests.unit import test_wire": TESTS / "unit" / "test_wire.py",
        "from .test_recovery import x": TESTS / "integration" / "test_recovery.py",
        "from . import test_restart": TESTS / "integration" / "test_restart.py",
        "from ..unit.test_readme import x": TESTS / "unit" / "test_readme.py",
        "from tests.support.signing import signed": TESTS / "support" / "signing.py",
        "from tests.conftest import PROSE": TESTS / "conftest.py",
        "from .conftest import Deployment": TESTS / "integration" / "conftest.py",
        "from ..conftest import process": TESTS / "conftest.py",
        "from tests import conftest": TESTS / "conftest.py",
        "import tests.integration.conftest": TESTS / "integration" / "conftest.py",
    }
    for source, target in forms.items():
        assert target in imported(source, here), source
