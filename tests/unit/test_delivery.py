"""Deliveries: a batch is settled only once its sends are acknowledged, in order; a failed send
stops the stage for good; /health reports failures and stalls, /ready delivery."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from neardup.pipeline.delivery import Deliveries
from neardup.stream.metrics import Metrics


async def test_batches_settle_in_order_once_their_sends_are_acknowledged() -> None:
    loop = asyncio.get_running_loop()
    failures: list[str] = []
    stage = Deliveries("test", failures.append)
    runner = asyncio.ensure_future(stage.run())
    first, second = loop.create_future(), loop.create_future()
    settled: list[str] = []
    await stage.settle([first], lambda: settled.append("first"))
    await stage.settle([second], lambda: settled.append("second"))
    second.set_result(None)  # acknowledged first, but its batch comes after the other
    await asyncio.sleep(0.01)
    assert settled == [] and stage.unsettled == 2
    first.set_result(None)
    await asyncio.wait_for(stage.drain(), 1)
    assert settled == ["first", "second"] and stage.unsettled == 0 and failures == []
    runner.cancel()


async def test_a_failed_send_stops_the_stage_and_nothing_after_it_settles() -> None:
    loop = asyncio.get_running_loop()
    failures: list[str] = []
    stage = Deliveries("test", failures.append)
    runner = asyncio.ensure_future(stage.run())
    failing, later = loop.create_future(), loop.create_future()
    settled: list[str] = []
    await stage.settle([failing], lambda: settled.append("failing"))
    await stage.settle([later], lambda: settled.append("later"))
    later.set_result(None)
    failing.set_exception(RuntimeError("MessageSizeTooLarge"))
    await asyncio.sleep(0.05)
    assert settled == []
    assert len(failures) == 1 and "delivery_failed stage=test" in failures[0]
    assert "MessageSizeTooLarge" in failures[0]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(stage.drain(), 0.1)
    runner.cancel()


async def test_an_error_while_settling_fails_the_stage() -> None:
    failures: list[str] = []
    stage = Deliveries("test", failures.append)
    runner = asyncio.ensure_future(stage.run())

    def broken() -> None:
        raise OSError("store closed")

    await stage.settle([], broken)
    await asyncio.sleep(0.05)
    assert len(failures) == 1 and "settle_failed" in failures[0]
    runner.cancel()


async def test_a_full_queue_makes_the_stage_wait() -> None:
    loop = asyncio.get_running_loop()
    stage = Deliveries("test", lambda message: None, pending=2)
    runner = asyncio.ensure_future(stage.run())
    blocked = loop.create_future()
    await stage.settle([blocked], lambda: None)  # taken by the task, which awaits it
    await asyncio.sleep(0.01)
    await stage.settle([], lambda: None)
    await stage.settle([], lambda: None)
    third = asyncio.ensure_future(stage.settle([], lambda: None))
    await asyncio.sleep(0.05)
    assert not third.done()  # waits for room
    blocked.set_result(None)
    await asyncio.wait_for(third, 1)
    await asyncio.wait_for(stage.drain(), 1)
    runner.cancel()


def test_health_reports_failure_then_stall_then_ok() -> None:
    metrics = Metrics()
    assert metrics.health()["status"] == "starting"
    metrics.ready.set()
    metrics.loop_beat = time.monotonic()
    assert metrics.health() == {"status": "ok", "uptime_s": metrics.health()["uptime_s"]}
    metrics.stalled = "articles:0: 59 waiting, none taken for 61 s"
    assert metrics.health()["status"] == "stalled" and "articles" in metrics.health()["reason"]
    metrics.stalled = None
    metrics.stall_timeout = 0.5
    metrics.loop_beat = time.monotonic() - 1.0
    assert metrics.health()["status"] == "stalled" and "event loop" in metrics.health()["reason"]
    metrics.failure = "delivery_failed stage=index"
    assert metrics.health() == {
        "status": "failed",
        "uptime_s": metrics.health()["uptime_s"],
        "reason": "delivery_failed stage=index",
    }


def test_readiness_is_delivery_and_liveness_ignores_it() -> None:
    metrics = Metrics()
    assert metrics.readiness()["status"] == "starting"
    metrics.ready.set()
    metrics.loop_beat = time.monotonic()
    assert metrics.readiness()["status"] == "ok"
    metrics.unready = "stage index: 3 batches unacknowledged for 31 s"
    assert metrics.readiness() == {
        "status": "not_ready",
        "uptime_s": metrics.readiness()["uptime_s"],
        "reason": "stage index: 3 batches unacknowledged for 31 s",
    }
    assert metrics.health()["status"] == "ok"  # waiting for the broker is not a wedged process
    metrics.stalled = "articles:0: 59 waiting, none taken for 61 s"
    assert metrics.readiness()["status"] == "stalled"  # what is not alive is not ready either


def test_a_partition_without_progress_is_reported_stalled_and_a_waiting_stage_unacknowledged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from faust.types import TP

    from neardup.pipeline.health import FetchState, unready
    from neardup.stream import framework
    from neardup.stream.progress import Progress

    now = time.monotonic()
    stage = Deliveries("index", lambda message: None)
    tp = TP("articles", 0)
    # the consumer fetched up to the end; Faust handed the stream everything up to 99
    states = {tp: FetchState(position=100, end=100, handed=99)}
    monkeypatch.setattr(framework, "fetch_state", lambda app, tp: states.get(tp))
    consumer = SimpleNamespace(assignment=lambda: set(states))
    app: Any = SimpleNamespace(consumer=consumer)
    progress = Progress(app, cast(Any, None), cast(Any, None), cast(Any, None))
    progress.delivered[tp] = 99
    progress.taken_at["articles"] = now - 120
    assert progress.stalled(60.0) is None  # everything taken: nothing waits
    progress.delivered[tp] = 40
    assert "articles:0: 59 waiting" in (progress.stalled(60.0) or "")
    progress.taken_at["articles"] = now
    assert progress.stalled(60.0) is None  # waiting, but a batch was just taken
    assert unready([stage], 0.0, False, 30.0) is None
    stage.unsettled, stage.settled_at = 2, now - 31
    assert "stage index: 2 batches unacknowledged" in (unready([stage], 0.0, False, 30.0) or "")
    assert unready([stage], 0.0, False, 60.0) is None
    stage.settled_at = now
    assert unready([stage], 0.0, False, 30.0) is None
    sigs = TP("sigs", 0)
    states[sigs] = FetchState(position=3, end=10, handed=2)  # 7 not fetched yet
    progress.delivered[sigs], progress.taken_at["sigs"] = 2, now - 300
    assert "sigs:0: 7 waiting" in (progress.stalled(60.0) or "")
    # a rebuild in progress, or a stage waiting for the broker, is not a stall
    assert progress.stalled(60.0, {"sigs"}) is None


def test_a_commit_marker_or_aborted_records_past_the_last_record_are_not_waiting() -> None:
    """Under exactly-once the last transaction's commit marker sits at the high-water mark - 1 and
    is never delivered: an idle worker has nothing waiting. So with aborted records, which the
    consumer skips as it fetches them (its position moves past them)."""
    from neardup.pipeline.health import FetchState, waiting

    # records 0-9 taken, a commit marker at 10: the consumer's position is past it
    assert waiting(FetchState(position=11, end=11, handed=9), delivered=9) == 0
    # records 11-19 aborted and their abort marker at 20, fetched and skipped
    assert waiting(FetchState(position=21, end=21, handed=9), delivered=9) == 0
    # what does wait: records not fetched yet, and records handed to the stream but not taken
    assert waiting(FetchState(position=11, end=15, handed=9), delivered=9) == 4
    assert waiting(FetchState(position=21, end=21, handed=19), delivered=9) == 10
    # nothing known yet (a consumer resetting its position, or no fetch answered): not waiting
    assert waiting(FetchState(position=None, end=None, handed=None), delivered=None) == 0


async def test_after_a_failure_no_batch_is_taken_and_none_acknowledged() -> None:
    """Faust replaces an agent that raised with one that goes on past the failed batch; were its
    batches acknowledged, Faust's commits would skip the failed one (its check is off while the
    group has committed nothing), and the restart would never bring it back."""
    from types import SimpleNamespace

    from faust.types import TP

    from neardup.pipeline.health import Failure
    from neardup.stream.progress import Progress

    acknowledged: list[list[Any]] = []
    stream = SimpleNamespace(acknowledge=lambda batch: _recorded(acknowledged, batch))
    app: Any = SimpleNamespace(consumer=SimpleNamespace(highwater=lambda tp: None))
    stops: list[int] = []
    failure = Failure(Metrics(), 5.0, stop_worker=lambda: stops.append(1))
    progress = Progress(app, Metrics(), cast(Any, None), failure)
    tp = TP("articles", 0)
    batch = [cast(Any, SimpleNamespace(message=SimpleNamespace(tp=tp, offset=n))) for n in (7, 8)]
    await progress.hold_if_failed()  # no failure: goes on at once
    await progress.acknowledge(stream, batch, [])
    assert acknowledged == [batch]
    failure.fail("agent_failed agent=sign error=InjectedFault(); stopping the worker")
    assert stops == [1]
    later = [cast(Any, SimpleNamespace(message=SimpleNamespace(tp=tp, offset=9)))]
    await progress.acknowledge(stream, later, [])
    assert acknowledged == [batch]  # the later batch is not acknowledged
    held = asyncio.ensure_future(progress.hold_if_failed())
    await asyncio.sleep(0.05)
    assert not held.done()  # an agent waits there until the worker's stop cancels it
    held.cancel()


async def _recorded(into: list[list[Any]], batch: list[Any]) -> None:
    into.append(batch)
