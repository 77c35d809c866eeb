"""Shared fixtures: real prose to shingle, engines and states. And how a run is laid out: the
`integration` mark, the order tests are handed to parallel workers, and each test's time budget (see
tests/run).

Only fixtures and hooks live here, which pytest hands to tests; the plain helpers they use, and tests
import, are in tests/support/ (tests/unit/test_imports_between_tests.py checks that no module imports
a conftest).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from neardup.core.params import DedupParams
from neardup.pipeline.shard import IndexShard
from neardup.state.memory import MemoryState
from neardup.state.port import StateStore
from neardup.state.rocks import RocksOptions, RocksState
from tests.support.prose import PROSE


@pytest.fixture
def prose() -> tuple[str, ...]:
    """Five unrelated real paragraphs, 0.8-2.5 KB each."""
    return PROSE


@pytest.fixture
def params() -> DedupParams:
    return DedupParams()


@pytest.fixture
def shard(params: DedupParams) -> IndexShard:
    return IndexShard(MemoryState(), params)


@pytest.fixture(params=["memory", "rocks", "rocks-without-wal", "rocks-held"])
def make_state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], StateStore]]:
    """A factory for the state adapter under test; for RocksDB each call reopens the same directory
    (close the previous one first). Everything opened is closed at teardown."""
    opened: list[StateStore] = []
    memory = MemoryState()

    def make() -> StateStore:
        if request.param == "memory":
            state: StateStore = memory
        else:  # without a write-ahead log: the stream's derived index, rebuilt after a crash
            options = RocksOptions(
                write_ahead_log=request.param != "rocks-without-wal",
                hold_families=request.param == "rocks-held",
            )
            state = RocksState(tmp_path / "state", options)
        opened.append(state)
        return state

    yield make
    for state in opened:
        with contextlib.suppress(Exception):  # a RocksState closed by the test itself
            state.close()


# --- how a run is laid out ---------------------------------------------------------------------------

TESTS = Path(__file__).resolve().parent
# What one test's call may take, in seconds, as it takes alone on this 2-core machine, unless it
# carries @pytest.mark.budget(seconds): a fault test proves its mechanism on a small stream within
# it. A test past its budget times NEARDUP_TEST_BUDGET_SCALE (2: in a parallel run on a shared
# machine tests took 1.1-2.6 times what they take alone; 0 turns the report off) is listed at the
# end of the run. It is not failed: how long a test took on a busy machine says nothing of whether
# the behaviour it checks is right, and CI's own time limit bounds the whole run.
TEST_BUDGET_S = 20.0
BUDGET_SCALE = float(os.environ.get("NEARDUP_TEST_BUDGET_SCALE", "2"))
OVER_BUDGET = "over_budget"  # the user property a test over its budget carries to the report


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/integration is marked `integration` (tests/run --fast leaves those
    out but the `smoke` ones). Handed to parallel workers, those go first: they are the long ones,
    and the many short unit tests then fill what is left of each worker's time."""
    integration = TESTS / "integration"
    for item in items:
        if item.path.is_relative_to(integration):
            item.add_marker(pytest.mark.integration)
    if config.getoption("dist", "no") != "no":
        items.sort(key=lambda item: not item.path.is_relative_to(integration))  # stable


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """pytest-xdist names a test of an xdist_group "<nodeid>@<group>" by setting `_nodeid`, which
    pytest 9 no longer reads (its node id is `_id`): without this, --dist loadgroup spreads a
    group's tests over every worker, and the heavy ones run side by side. Before xdist's own
    hook sends the collected ids to the scheduler."""
    from _pytest.nodeid import NodeId

    for item in session.items:
        renamed = item.__dict__.get("_nodeid")
        if isinstance(renamed, str) and renamed != item.nodeid:
            item._id = NodeId.parse(renamed)  # type: ignore[attr-defined]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test that passed but took longer than its budget says so in its report (listed at the
    end of the run by pytest_terminal_summary, from whichever worker ran it)."""
    report = yield
    if call.when == "call" and report.passed and BUDGET_SCALE > 0:
        marker = item.get_closest_marker("budget")
        budget = float(marker.args[0]) if marker else TEST_BUDGET_S
        if call.duration > budget * BUDGET_SCALE:
            report.user_properties.append(
                (OVER_BUDGET, f"{item.nodeid} took {call.duration:.1f} s, budget {budget:g} s")
            )
    return report


_over_budget: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """On the process that reports (xdist's controller too): the tests over their budget."""
    _over_budget.extend(value for name, value in report.user_properties if name == OVER_BUDGET)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _over_budget:
        terminalreporter.section(f"over {BUDGET_SCALE:g} times their time budget (reported, not failed)")
        for line in _over_budget:
            terminalreporter.line(line)
