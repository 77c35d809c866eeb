"""The layers: the broker-free pipeline, embedded mode, the library and `neardup evaluate` never
reach the Kafka adapter (service/stream) or its frameworks; only the CLI does."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import neardup

SERVICE = Path(neardup.__file__).parent
ADAPTER_FREE = sorted(
    [
        *(SERVICE / "pipeline").glob("*.py"),
        *(SERVICE / name for name in ("embedded.py", "api.py", "evaluation.py")),
    ]
)
FRAMEWORKS = ("faust", "aiokafka", "mode", "kafka")


def absolute_imports(module: Path, source: str | None = None) -> list[str]:
    """What a module of the package imports, relative imports resolved to `neardup.…`."""
    package = ["neardup", *module.parent.relative_to(SERVICE).parts]
    names = []
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8") if source is None else source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                names.append(".".join(base + ([node.module] if node.module else [])))
            else:
                names.append(node.module or "")
    return names


def offences(imported: list[str]) -> list[str]:
    return [
        name for name in imported if name.startswith("neardup.stream") or name.split(".")[0] in FRAMEWORKS
    ]


# Parsed at collection, before any test runs: on this Python, a RecursionError caught in an
# earlier test (the deep-nesting inputs) can leave ast.parse failing for the rest of the process.
IMPORTS = {module: absolute_imports(module) for module in SERVICE.rglob("*.py")}
STATE_CLASSES = {
    path: [
        node.name
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.ClassDef)
    ]
    for path in sorted((SERVICE / "state").glob("*.py"))
}
FAKE_IMPORTS = absolute_imports(
    SERVICE / "pipeline" / "fake.py",
    "from ..stream import app\nimport aiokafka\nfrom .wire import Signed\nfrom ..core import lsh\n",
)


@pytest.mark.parametrize("module", ADAPTER_FREE, ids=lambda m: str(m.relative_to(SERVICE)))
def test_the_pipeline_and_its_callers_import_nothing_of_the_adapter(module: Path) -> None:
    assert not offences(IMPORTS[module]), f"{module.relative_to(SERVICE)} imports {offences(IMPORTS[module])}"


def test_only_the_cli_imports_the_adapter_from_outside_it() -> None:
    outside = [p for p in SERVICE.rglob("*.py") if "stream" not in p.relative_to(SERVICE).parts]
    importers = {p.name for p in outside if any(n.startswith("neardup.stream") for n in IMPORTS[p])}
    assert importers == {"cli.py"}


def test_importing_them_loads_neither_the_adapter_nor_its_frameworks() -> None:
    """Transitively too: a fresh interpreter imports every adapter-free module and lists what came in."""
    modules = ["neardup." + ".".join(p.relative_to(SERVICE).with_suffix("").parts) for p in ADAPTER_FREE]
    script = (
        f"import sys\nfor m in {modules!r}: __import__(m)\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('neardup.stream') "
        f"or m.split('.')[0] in {FRAMEWORKS!r}))"
    )
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert loaded.stdout.split() == []


def test_the_check_can_fail() -> None:
    assert offences(FAKE_IMPORTS) == ["neardup.stream", "aiokafka"]


def test_the_state_port_depends_on_none_of_its_adapters() -> None:
    """The adapters import the port's types from the port, never the reverse."""
    adapters = tuple(f"neardup.state.{name}" for name in ("index", "memory", "rocks", "records"))
    port = SERVICE / "state" / "port.py"
    assert [name for name in IMPORTS[port] if name.startswith(adapters)] == []


def test_the_state_port_defines_the_types_its_adapters_exchange() -> None:
    """The index's store port (KeyValue, the Batch it writes) and the state's (StateStore, Counts,
    IndexStats) live in port.py, not beside one of their implementations."""
    defined = {name: path.name for path, names in STATE_CLASSES.items() for name in names}
    port_types = ("KeyValue", "Batch", "StateStore", "Counts", "IndexStats")
    assert {name: defined.get(name) for name in port_types} == dict.fromkeys(port_types, "port.py")


def test_faults_enter_only_through_the_test_hooks_seam_at_process_start() -> None:
    """No module of the package reaches the tests' faults; the seam (testhooks.py) is loaded where
    a process starts (the worker's command, a helper's entry point), never on the hot path."""
    imported = {p.relative_to(SERVICE).as_posix(): names for p, names in IMPORTS.items()}
    assert [path for path, names in imported.items() if any(n.split(".")[0] == "tests" for n in names)] == []
    seam_users = {path for path, names in imported.items() if "neardup.testhooks" in names}
    assert seam_users == {"stream/commands.py", "pipeline/child.py"}


def test_the_wire_format_depends_on_no_state_codec() -> None:
    """The signatures topic's layout is the pipeline's own: a change to how the state stores a
    record must not change what the sign stage writes."""
    wire = SERVICE / "pipeline" / "wire.py"
    assert IMPORTS[wire] and [name for name in IMPORTS[wire] if name.startswith("neardup.state")] == []


# Parsed at collection too (see IMPORTS): each function of the package and its length in lines.
FUNCTION_LINES = {
    f"{path.relative_to(SERVICE)}:{node.name}": node.end_lineno - node.lineno + 1  # type: ignore[operator]
    for path in SERVICE.rglob("*.py")
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
}


def test_no_function_is_longer_than_a_screen() -> None:
    assert FUNCTION_LINES and max(FUNCTION_LINES.values()) > 20
    long = {name: lines for name, lines in FUNCTION_LINES.items() if lines > 80}
    assert not long, f"split these functions (lines): {long}"


LOCAL_SIMILARITY = "neardup.local_similarity"
# What the report of `compare --local` takes from the engine rather than duplicate it, and why.
LOCAL_SIMILARITY_USES = {
    "neardup.core._hashing": "the 64-bit finalizer of its chunk digests",
    "neardup.core.similarity": "the set measures, so that empty fingerprints agree with the engine's",
    "neardup.core.anchors": "the anchor passages the report shows beside its own, as a verdict finds them",
    "neardup.core.dedup": "how many passages a verdict names",
    "neardup.core.normalize": "the canonical form those anchor passages' offsets index",
}


def named_imports(module: Path, source: str | None = None) -> list[str]:
    """absolute_imports, and each name a `from … import` takes as a submodule of its module, so
    that `from .. import local_similarity` counts as importing neardup.local_similarity."""
    tree = ast.parse(module.read_text(encoding="utf-8") if source is None else source)
    names = absolute_imports(module, source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = absolute_imports(module, ast.unparse(node))[0]
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


# Parsed at collection (see IMPORTS).
NAMED_IMPORTS = {module: named_imports(module) for module in SERVICE.rglob("*.py")}
FAKE_ENGINE_IMPORTS = named_imports(SERVICE / "core" / "fake.py", "from .. import local_similarity\n")


def in_local_similarity(module: Path) -> bool:
    return module.relative_to(SERVICE).parts[0] == "local_similarity"


def local_similarity_importers(imports: dict[Path, list[str]]) -> set[str]:
    return {
        module.relative_to(SERVICE).as_posix()
        for module, names in imports.items()
        if not in_local_similarity(module) and any(n.startswith(LOCAL_SIMILARITY) for n in names)
    }


def test_only_the_cli_imports_the_local_similarity_report() -> None:
    """The engine (core, pipeline, state, stream) and the other entry points never import it, not
    even through one another: the whole package outside it is checked, so no chain reaches it."""
    assert local_similarity_importers(NAMED_IMPORTS) == {"cli.py"}


def test_the_local_similarity_report_takes_from_the_engine_only_what_it_reuses() -> None:
    taken = {
        name
        for module, names in IMPORTS.items()
        if in_local_similarity(module)
        for name in names
        if name.startswith("neardup.") and not name.startswith(LOCAL_SIMILARITY)
    }
    assert taken == set(LOCAL_SIMILARITY_USES)


def test_the_local_similarity_checks_can_fail() -> None:
    assert FAKE_ENGINE_IMPORTS == ["neardup", LOCAL_SIMILARITY]
    assert local_similarity_importers({SERVICE / "core" / "fake.py": FAKE_ENGINE_IMPORTS}) == {"core/fake.py"}
