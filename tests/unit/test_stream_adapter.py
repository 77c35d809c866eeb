"""service/stream is the Kafka adapter: each of its modules speaks Kafka through Faust, aiokafka or
mode itself, or is on the list below with why it belongs there anyway. A module that speaks none
of them and holds a product rule belongs with that rule (pipeline/, core/), where it is tested
without a broker."""

from __future__ import annotations

import ast
from pathlib import Path

import neardup

STREAM = Path(neardup.__file__).parent / "stream"
FRAMEWORKS = ("faust", "aiokafka", "mode")
# Modules of the adapter that import no framework themselves, and why each is Kafka's all the same.
SPEAKS_KAFKA_THROUGH_WHAT_IT_IS_GIVEN = {
    "batches.py": "builds aiokafka's producer batches, on the producer it is handed (framework.py)",
    "inline.py": "runs Faust's consumer callback inline (framework.py's consumer wires it)",
    "metrics.py": "the worker's probes and metrics: lag, offsets, transactions of the consumer group",
    "standby.py": "the warm standby's loop over the committed changelog, between group assignments",
}


def frameworks_imported(module: Path) -> set[str]:
    """The frameworks a module imports itself (absolute imports: the package's own are relative)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names & set(FRAMEWORKS)


# Parsed at collection, before any test runs: on this Python, a RecursionError caught in an
# earlier test (the deep-nesting inputs) can leave ast.parse failing for the rest of the process.
IMPORTED = {module.name: frameworks_imported(module) for module in STREAM.glob("*.py")}


def test_each_stream_module_speaks_kafka_or_says_why() -> None:
    silent = sorted(name for name, imported in IMPORTED.items() if name != "__init__.py" and not imported)
    assert silent == sorted(SPEAKS_KAFKA_THROUGH_WHAT_IT_IS_GIVEN), (
        "a module of service/stream that imports neither Faust, aiokafka nor mode: move the rule it "
        "holds out of the adapter, or list it here with why it is Kafka's"
    )


def test_the_check_reads_imports() -> None:
    assert IMPORTED["framework.py"] >= {"faust", "aiokafka", "mode"}
    assert IMPORTED["inline.py"] == set()
