"""The worker's health policy (pipeline/health.py) on plain values, with no broker: which topics'
stalls count, when no broker answering suspends the stall check, and why the worker is not ready;
and the worker's watch (stream/app.py) applying it to what it reads."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

from neardup.pipeline.delivery import Deliveries
from neardup.pipeline.health import broker_away, busy, unready
from neardup.stream.app import Runtime

TOPICS = ("articles", "signatures")  # the sign stage's input, the index stage's shard


def _stages() -> tuple[Deliveries, Deliveries]:
    return Deliveries("sign", lambda message: None), Deliveries("index", lambda message: None)


async def _unsettle(stage: Deliveries) -> None:
    """One batch handed over whose send the broker has not acknowledged."""
    await stage.settle([asyncio.get_running_loop().create_future()], lambda: None)


def test_no_broker_answering_for_the_limit_is_an_outage() -> None:
    assert not broker_away(30.0, 30.0)
    assert broker_away(30.1, 30.0)
    assert not broker_away(0.0, 30.0)


async def test_a_topic_is_busy_while_its_agent_works_or_its_stage_waits_for_the_broker() -> None:
    signed, indexed = _stages()
    assert busy(TOPICS, (signed, indexed), opening=False, isolating=False) == set()
    # the signer isolates a message that broke a helper: the input's agent is at work
    assert busy(TOPICS, (signed, indexed), opening=False, isolating=True) == {"articles"}
    # the index is opened or rebuilt before the shard's next batch
    assert busy(TOPICS, (signed, indexed), opening=True, isolating=False) == {"signatures"}
    assert busy(TOPICS, (signed, indexed), opening=True, isolating=True) == set(TOPICS)
    await _unsettle(indexed)
    assert busy(TOPICS, (signed, indexed), opening=False, isolating=False) == {"signatures"}
    await _unsettle(signed)
    assert busy(TOPICS, (signed, indexed), opening=False, isolating=False) == set(TOPICS)


async def test_unready_names_unacknowledged_sends_first_then_no_broker_then_the_opening_index() -> None:
    signed, indexed = _stages()
    assert unready((signed, indexed), unseen=1.0, opening=False, limit=30.0) is None
    assert unready((signed, indexed), unseen=1.0, opening=True, limit=30.0) == "opening the index"
    assert unready((signed, indexed), unseen=31.0, opening=True, limit=30.0) == "no broker answered for 31 s"
    await _unsettle(indexed)
    # waiting, but not for longer than the limit yet
    assert unready((signed, indexed), unseen=1.0, opening=False, limit=30.0) is None
    indexed.settled_at = time.monotonic() - 31
    reason = unready((signed, indexed), unseen=31.0, opening=True, limit=30.0) or ""
    assert reason.startswith("stage index: 1 batches unacknowledged for 3"), reason


class _Progress:
    """What the watch asks of the adapter's progress: its stall check, and the stall clocks."""

    def __init__(self) -> None:
        self.taken_at = {"articles": 0.0, "signatures": 0.0}
        self.asked: list[tuple[float, set[str]]] = []

    def took(self, topic: str) -> None:
        self.taken_at[topic] = time.monotonic()

    def stalled(self, limit: float, busy: set[str]) -> str | None:
        self.asked.append((limit, set(busy)))
        return "articles:0: 5 waiting, none taken for 61 s"


def _runtime(broker_seen: float, opening: bool, isolating: bool) -> tuple[Runtime, _Progress]:
    signed, indexed = _stages()
    progress = _Progress()
    settings = SimpleNamespace(
        input_topic="articles", signatures_topic="signatures", ready_timeout=30.0, stall_timeout=60.0
    )
    runtime = SimpleNamespace(
        settings=settings,
        metrics=SimpleNamespace(broker_seen=broker_seen),
        signed=signed,
        indexed=indexed,
        sign=SimpleNamespace(progress=progress, signer=SimpleNamespace(isolating=isolating)),
        index=SimpleNamespace(decider=SimpleNamespace(opening=opening)),
        stages=lambda: [signed, indexed],
    )
    return cast(Any, runtime), progress


def test_the_watch_asks_for_a_stall_past_the_busy_topics() -> None:
    runtime, progress = _runtime(time.monotonic(), opening=True, isolating=False)
    assert Runtime.stalled(runtime) == "articles:0: 5 waiting, none taken for 61 s"
    assert progress.asked == [(60.0, {"signatures"})]
    assert Runtime.unready(runtime) == "opening the index"


def test_the_watch_restarts_the_stall_clocks_while_no_broker_answers() -> None:
    runtime, progress = _runtime(time.monotonic() - 31, opening=False, isolating=False)
    before = time.monotonic()
    assert Runtime.stalled(runtime) is None
    assert progress.asked == []  # no stall counts during an outage
    assert all(taken >= before for taken in progress.taken_at.values())
    assert (Runtime.unready(runtime) or "").startswith("no broker answered for 3")
