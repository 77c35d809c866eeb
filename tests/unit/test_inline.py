"""Coroutines run inline until they wait (inline.py), and the worker consumer's hand-off built on it:
the same outcomes as Faust's `wait_first`, with tasks only for callbacks that wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import faust
import pytest
from mode.utils.locks import Event as ModeEvent

from neardup.stream import framework
from neardup.stream.framework import LeanStream, app_class
from neardup.stream.inline import run_until_wait, wait_for_event


async def test_a_coroutine_that_does_not_wait_finishes_in_the_calling_task() -> None:
    ran_in: list[asyncio.Task[Any] | None] = []

    async def quick(value: int) -> int:
        ran_in.append(asyncio.current_task())
        return value * 2

    assert run_until_wait(quick(21)) == (True, 42)
    assert ran_in == [asyncio.current_task()]


async def test_a_coroutine_that_waits_is_finished_by_its_rest_with_what_it_waited_for() -> None:
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    steps: list[str] = []

    async def slow() -> str:
        steps.append("before")
        got = await gate
        steps.append(got)
        await asyncio.sleep(0)  # a bare yield: waits on nothing
        await asyncio.sleep(0.001)
        return got.upper()

    finished, rest = run_until_wait(slow())
    assert finished is False and steps == ["before"]
    task = asyncio.ensure_future(rest)
    await asyncio.sleep(0)
    assert not task.done()
    gate.set_result("opened")
    assert await task == "OPENED"
    assert steps == ["before", "opened"]


async def test_exceptions_propagate_before_and_after_the_first_wait() -> None:
    async def fails_at_once() -> None:
        raise ValueError("at once")

    with pytest.raises(ValueError, match="at once"):
        run_until_wait(fails_at_once())

    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def fails_later() -> None:
        await gate
        raise KeyError("later")

    finished, rest = run_until_wait(fails_later())
    assert not finished
    gate.set_result(None)
    with pytest.raises(KeyError, match="later"):
        await rest

    failing: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def waits_on_a_failure() -> str:
        try:
            await failing
        except OSError as exc:
            return f"caught {exc}"
        return "not raised"

    finished, rest = run_until_wait(waits_on_a_failure())
    failing.set_exception(OSError("broken"))
    assert await rest == "caught broken"


async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    cleaned: list[str] = []

    async def waits_forever() -> None:
        try:
            await gate
        except asyncio.CancelledError:
            cleaned.append("cancelled")
            raise

    _, rest = run_until_wait(waits_forever())
    task = asyncio.ensure_future(rest)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["cancelled"] and gate.cancelled()


async def test_closing_the_rest_unstarted_closes_the_coroutine() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    closed: list[bool] = []

    async def waits() -> None:
        try:
            await gate
        finally:
            closed.append(True)

    _, rest = run_until_wait(waits())
    rest.close()
    assert closed == [True]


@pytest.fixture
async def consumer() -> AsyncIterator[Any]:
    """The worker app's Faust consumer on the test's loop, not started (no broker needed to hand
    messages off)."""
    app = app_class(7, 4096)(
        "hand-off",
        broker="kafka://127.0.0.1:1",
        store="memory://",
        web_enabled=False,
        loop=asyncio.get_running_loop(),
    )
    app.finalize()
    yield app.consumer


async def test_the_consumer_runs_a_callback_that_does_not_wait_without_tasks(
    consumer: Any, recwarn: pytest.WarningsRecorder
) -> None:
    ran_in: list[asyncio.Task[Any] | None] = []

    async def deliver(message: str) -> str:
        ran_in.append(asyncio.current_task())
        return message

    results = await consumer.wait_first(deliver("m1"), consumer.suspend_flow.wait())
    assert results.results == ["m1"] and not results.stopped
    assert ran_in == [asyncio.current_task()]
    # the flow's wait, never started, is closed rather than left to be reported unawaited
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


async def test_the_consumer_abandons_a_waiting_callback_when_the_flow_is_suspended(consumer: Any) -> None:
    """As Faust's own hand-off does: a rebalance suspends the flow, and a delivery blocked on a
    full stream buffer must not hold the consumer."""
    buffer_has_room: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    delivered: list[str] = []

    async def deliver(message: str) -> None:
        await buffer_has_room
        delivered.append(message)

    hand_off = asyncio.ensure_future(consumer.wait_first(deliver("m1"), consumer.suspend_flow.wait()))
    await asyncio.sleep(0.01)
    assert not hand_off.done()
    consumer.suspend_flow.set()
    results = await asyncio.wait_for(hand_off, 1.0)
    assert results.results == [True]  # the flow's wait won
    await asyncio.sleep(0)
    assert buffer_has_room.cancelled() and delivered == []


async def test_the_consumer_finishes_a_callback_that_waits(consumer: Any) -> None:
    async def deliver(message: str) -> str:
        await asyncio.sleep(0.005)
        return message

    results = await consumer.wait_first(deliver("m2"), consumer.suspend_flow.wait())
    assert results.results == ["m2"] and not results.stopped


async def test_with_the_flow_suspended_the_callback_goes_the_way_faust_runs_it(consumer: Any) -> None:
    ran_in: list[asyncio.Task[Any] | None] = []

    async def deliver(message: str) -> str:
        ran_in.append(asyncio.current_task())
        return message

    consumer.suspend_flow.set()
    results = await consumer.wait_first(deliver("m3"), consumer.suspend_flow.wait())
    assert "m3" in results.results
    assert ran_in and ran_in[0] is not asyncio.current_task()


def test_the_app_class_uses_this_consumer() -> None:
    app = app_class(7, 4096)(
        "which-consumer", broker="kafka://127.0.0.1:1", store="memory://", web_enabled=False
    )
    assert isinstance(app, faust.App)
    assert "wait_first" in type(app.consumer).__dict__


async def test_wait_for_event_returns_at_once_when_set_when_set_later_and_at_its_timeout() -> None:
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await wait_for_event(event, 0.02) is False
    assert loop.time() - started >= 0.015
    loop.call_later(0.01, event.set)
    started = loop.time()
    assert await wait_for_event(event, 5.0) is True
    assert loop.time() - started < 1.0
    assert await wait_for_event(event, 0.0) is True  # already set: no wait


async def test_wait_for_event_accepts_modes_event() -> None:
    event = ModeEvent()
    asyncio.get_running_loop().call_later(0.005, event.set)
    assert await wait_for_event(event, 5.0) is True


async def test_a_cancelled_wait_for_event_is_cancelled_not_timed_out() -> None:
    task = asyncio.ensure_future(wait_for_event(asyncio.Event(), 60.0))
    await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.fixture
async def memory_app() -> AsyncIterator[faust.App]:
    app = app_class(7, 4096)(
        "streams", broker="memory://", store="memory://", web_enabled=False, loop=asyncio.get_running_loop()
    )
    app.finalize()
    yield app


async def _until(condition: Any, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.002)


async def test_the_take_loop_hands_over_a_full_buffer_at_once_and_the_rest_within_of_its_first(
    memory_app: faust.App,
) -> None:
    loop = asyncio.get_running_loop()
    batches: list[tuple[list[Any], float]] = []

    @memory_app.agent(memory_app.channel(), name="taker")
    async def taker(stream: Any) -> None:
        async for batch in stream.take_events(3, within=0.2):
            batches.append(([event.value for event in batch], loop.time()))

    async with taker.test_context() as agent:
        started = loop.time()
        for value in range(4):
            await agent.put(value)
        await _until(lambda: len(batches) == 2)
        assert [values for values, _ in batches] == [[0, 1, 2], [3]]
        assert batches[0][1] - started < 0.15  # full: not held for `within`
        assert 0.15 <= batches[1][1] - started < 2.0  # held `within` after its first event
        # a lone event after a quiet spell: `within` after it, not at a tick running meanwhile
        await asyncio.sleep(0.3)
        sent = loop.time()
        await agent.put(4)
        await _until(lambda: len(batches) == 3)
        assert batches[2][0] == [4]
        assert 0.15 <= batches[2][1] - sent < 2.0


async def test_an_idle_take_loop_does_not_tick_every_within(
    memory_app: faust.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []

    async def counted(event: Any, timeout: float) -> bool:
        waits.append(timeout)
        return await wait_for_event(event, timeout)

    monkeypatch.setattr(framework, "wait_for_event", counted)

    @memory_app.agent(memory_app.channel(), name="idler")
    async def idler(stream: Any) -> None:
        async for _ in stream.take_events(10, within=0.001):
            pass

    async with idler.test_context():
        await asyncio.sleep(0.35)
    # ~4 looks at should_stop in 0.35 s, where a 1 ms tick would have woken ~350 times
    assert 1 <= len(waits) <= 6
    assert all(timeout == framework.IDLE_CHECK_S for timeout in waits)


async def test_a_batch_whose_handling_raised_is_never_acknowledged(
    memory_app: faust.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faust commits acknowledged offsets only: a batch the agent failed on must come back after a
    restart, so it stays unacknowledged even when its take loop is closed; the take loop itself
    acknowledges nothing (the agent does, once what the batch caused is delivered)."""
    acked: list[Any] = []

    async def ack(self: Any, event: Any) -> bool:
        acked.append(event.value)
        return True

    monkeypatch.setattr(LeanStream, "ack", ack)
    handled: list[list[Any]] = []

    @memory_app.agent(memory_app.channel(), name="failing")
    async def failing(stream: Any) -> None:
        async for batch in stream.take_events(10, within=0.001):
            handled.append([event.value for event in batch])
            if handled[-1] == ["bad"]:
                raise RuntimeError("handling failed")
            if handled[-1] == ["good"]:
                await stream.acknowledge(batch)

    async with failing.test_context() as agent:
        await agent.put("good")
        await _until(lambda: handled == [["good"]])
        await agent.put("bad")
        await _until(lambda: len(handled) == 2)
        await _until(lambda: acked == ["good"])
    assert acked == ["good"]


def test_the_agents_read_through_lean_streams(memory_app: faust.App) -> None:
    """The sign and index agents' take_events loops (exercised in test_agents_memory.py) run on
    the app's stream class."""

    @memory_app.agent(memory_app.channel(), name="probe")
    async def probe(stream: Any) -> None:
        async for _ in stream:
            pass

    assert isinstance(memory_app.agents["probe"].stream(), LeanStream)
