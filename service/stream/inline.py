"""Running a coroutine in the caller's task until it first has to wait, and in a task only then.

Faust hands every input message to its streams through `Service.wait_first(callback(message),
suspend_flow.wait())`, which starts four tasks and an `asyncio.wait` per message: far more work
than the callback itself, which nearly always finishes without waiting (tests/benchmarks/RESULTS.md
compares the two). The worker's consumer (framework.py's app_class) runs the callback inline
first and pays for the tasks only when it waits.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from typing import Any


def run_until_wait(coro: Coroutine[Any, Any, Any]) -> tuple[bool, Any]:
    """Run `coro` in the calling task until it finishes or first waits.

    (True, its result) when it finished; (False, a coroutine that runs the rest of it) when it
    waits, to be awaited or wrapped in a task. Its exceptions propagate from here or from the rest.
    """
    try:
        waiting_on = coro.send(None)
    except StopIteration as finished:
        return True, finished.value
    return False, _rest_of(coro, waiting_on)


@types.coroutine
def _rest_of(coro: Coroutine[Any, Any, Any], waiting_on: Any) -> Generator[Any, Any, Any]:
    """What `yield from coro` would do, for a coroutine that has already yielded `waiting_on`:
    pass what it waits on to the task that runs this, and what the task sends or throws back in."""
    while True:
        thrown: BaseException | None = None
        try:
            received = yield waiting_on
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # a cancellation, most often
            thrown = exc
        try:
            waiting_on = coro.send(received) if thrown is None else coro.throw(thrown)
        except StopIteration as finished:
            return finished.value


async def wait_for_event(event: Any, timeout: float) -> bool:
    """Wait at most `timeout` seconds for `event` (an asyncio or mode Event); True when it is set.

    One timer and the event's own waiter, none of the three tasks and `asyncio.wait` that mode's
    `Service.wait_for_stopped` makes per call (the worker's take loop, LeanStream in framework.py)."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
