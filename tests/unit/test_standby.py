"""neardup.stream.standby: a worker that does not own the index shard catches its index up with the
changelog (a real decider on a real RocksDB; a list stands in for the changelog topic), reports its
lag, stands aside while it owns the shard or its own decisions are unsettled, and survives a failed
step."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from neardup.config import Settings
from neardup.pipeline.decider import Decider
from neardup.pipeline.delivery import Deliveries
from neardup.state.rocks import RocksOptions
from neardup.stream.metrics import Metrics
from neardup.stream.standby import Standby
from tests.support.changelog import ListChangelog
from tests.support.decider import decide, packed
from tests.support.signing import FUTURE, HISTORY, PARAMS


class FailingChangelog(ListChangelog):
    """A changelog whose broker stops answering once `broken` is set."""

    broken = False

    async def end(self) -> int:
        if self.broken:
            raise ConnectionError("no broker answers")
        return await super().end()


@pytest.fixture
async def deciders(tmp_path: Path) -> AsyncIterator[tuple[Decider, Decider, FailingChangelog]]:
    records = FailingChangelog()
    owner = Decider(PARAMS, tmp_path / "owner", RocksOptions(), records, in_process=True)
    copy = Decider(PARAMS, tmp_path / "standby", RocksOptions(), records, in_process=True)
    await owner.open()
    yield owner, copy, records
    for decider in (owner, copy):
        await decider.close(clean=False)


def standby_of(decider: Decider) -> tuple[Standby, Any]:
    """The standby over an index stage's parts as IndexAgent holds them."""
    failures: list[str] = []
    index = SimpleNamespace(
        lifecycle=SimpleNamespace(owner=False),
        lock=asyncio.Lock(),
        deliveries=Deliveries("index", failures.append),
        decider=decider,
        metrics=Metrics(),
    )
    settings = Settings.from_env({"NEARDUP_STANDBY_REPLICAS": "1"})
    return Standby(settings, index), index  # type: ignore[arg-type]


def sample(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


async def test_a_standby_reports_its_lag_and_applies_only_what_is_new(deciders: Any) -> None:
    owner, copy, records = deciders
    standby, index = standby_of(copy)
    await decide(owner, packed(HISTORY, 0))
    assert await standby.step()  # the first build, from the whole changelog
    metrics = index.metrics
    assert sample(metrics, "neardup_index_standby") == 1
    assert sample(metrics, "neardup_index_standby_lag_records") == len(records.entries)
    assert sample(metrics, "neardup_index_standby_applied_records_total") == 0
    before = len(records.entries)
    await decide(owner, packed(FUTURE, 20))
    assert await standby.step()
    new = len(records.entries) - before
    assert new > 0 and sample(metrics, "neardup_index_standby_lag_records") == new
    assert sample(metrics, "neardup_index_standby_applied_records_total") == new
    assert await standby.step()
    assert sample(metrics, "neardup_index_standby_lag_records") == 0  # it keeps up
    assert sample(metrics, "neardup_index_standby_applied_records_total") == new


async def test_a_standby_stands_aside_while_it_owns_the_shard_or_its_decisions_are_unsettled(
    deciders: Any,
) -> None:
    owner, copy, _ = deciders
    standby, index = standby_of(copy)
    await decide(owner, packed(HISTORY, 0))
    index.lifecycle.owner = True
    assert not await standby.step()
    assert copy.shard is None and sample(index.metrics, "neardup_index_standby") == 0
    index.lifecycle.owner = False
    acknowledged = asyncio.get_running_loop().create_future()
    await index.deliveries.settle([acknowledged], lambda: None)  # a former owner's send in flight
    assert not await standby.step() and copy.shard is None
    acknowledged.set_result(None)
    runner = asyncio.create_task(index.deliveries.run())
    try:
        await asyncio.wait_for(index.deliveries.drain(), 5)
    finally:
        runner.cancel()
    assert await standby.step() and copy.shard is not None


async def test_a_failed_step_is_reported_and_the_next_one_catches_up(deciders: Any) -> None:
    owner, copy, records = deciders
    standby, index = standby_of(copy)
    await decide(owner, packed(HISTORY, 0))
    records.broken = True
    assert not await standby.step()
    assert sample(index.metrics, "neardup_index_standby") == 0
    records.broken = False
    assert await standby.step()
    assert sample(index.metrics, "neardup_index_standby") == 1
    assert sample(index.metrics, "neardup_index_standby_lag_records") == len(records.entries)


async def test_a_shard_that_comes_during_a_catch_up_is_not_reported_as_a_standby(deciders: Any) -> None:
    owner, copy, _ = deciders
    standby, index = standby_of(copy)
    await decide(owner, packed(HISTORY, 0))
    catch_up = copy.catch_up

    async def assigned_meanwhile() -> int | None:
        count = await catch_up()
        index.lifecycle.owner = True  # the rebalance gives this worker the shard while it catches up
        return count

    copy.catch_up = assigned_meanwhile
    assert await standby.step()
    assert sample(index.metrics, "neardup_index_standby") == 0
