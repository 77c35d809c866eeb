"""At-least-once, checked: a batch's input offsets are acknowledged to Faust (which commits
acknowledged offsets only) once the broker has acknowledged every message the batch caused.

Sends are appended to producer batches and not awaited where they are made, so that signing,
deciding and publishing overlap. What each batch of a stage sent is handed here instead, in the
stage's order; a single task awaits the sends of one batch after the other and then runs what the
batch's acknowledgement means (acknowledge the input events, count, and for the index stage note
where the changelog now ends).
A send that fails, after what the producer retries itself, is final: the stage stops here, nothing
after it is acknowledged, and the worker is stopped for a failure (a supervisor restarts it, and the
input comes back from the last commit).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

log = logging.getLogger("neardup.delivery")

# Batches whose sends are in flight: a stage that gets this far ahead of the broker waits for it.
PENDING_BATCHES = 64

Then = Callable[[], Awaitable[None] | None]


class Deliveries:
    """One stage's batches, settled in the order they were handed over (`settle`).

    `fail(message)` is called once, with the first send that failed; the stage is then stuck for
    good (its later batches wait in the queue, never acknowledged), which is what stops consumption:
    committing past the failed batch would lose what it caused."""

    def __init__(self, stage: str, fail: Callable[[str], None], pending: int = PENDING_BATCHES) -> None:
        self.stage = stage
        self._fail = fail
        self._queue: asyncio.Queue[tuple[list[Any], Then]] = asyncio.Queue(pending)
        self._idle = asyncio.Event()
        self._idle.set()
        self.unsettled = 0  # batches handed over and not settled yet
        self.failed: str | None = None
        self.settled_at = time.monotonic()  # the last time a batch was settled (or the stage idle)

    async def settle(self, sends: Iterable[Any], then: Then) -> None:
        """Run `then` once every future in `sends` has resolved (after those of earlier batches);
        waits while PENDING_BATCHES batches are unsettled."""
        if self.unsettled == 0:
            self.settled_at = time.monotonic()  # a stage that was idle has not been stuck meanwhile
        self.unsettled += 1
        self._idle.clear()
        await self._queue.put(([send for send in sends if asyncio.isfuture(send)], then))

    async def drain(self) -> None:
        """Until everything handed over is settled (forever after a failure: callers bound it)."""
        await self._idle.wait()

    async def run(self) -> None:
        """The settling task (one per stage, for the app's life)."""
        while True:
            sends, then = await self._queue.get()
            for send in sends:
                try:
                    await send
                except Exception as exc:
                    await self._stuck(f"delivery_failed stage={self.stage} error={exc!r}")
            try:
                outcome = then()
                if outcome is not None:
                    await outcome
            except Exception as exc:
                log.exception("settle_failed stage=%s", self.stage)
                await self._stuck(f"settle_failed stage={self.stage} error={exc!r}")
            self.settled_at = time.monotonic()
            self.unsettled -= 1
            if self.unsettled == 0:
                self._idle.set()

    async def _stuck(self, failed: str) -> None:
        """The stage fails for good: the worker is stopped, and nothing after it is acknowledged."""
        self.failed = failed
        self._fail(f"{failed}; stopping the worker without committing past it")
        await asyncio.Event().wait()
