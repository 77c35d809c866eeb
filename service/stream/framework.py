"""Every use of Faust's, mode's and aiokafka's private attributes, in one place.

The worker needs a few things the frameworks do not offer publicly: batches taken without a timer
tick (LeanStream), a monitor without per-event bookkeeping (LeanMonitor), a consumer whose fetch wait
is configurable and which runs the stream callback inline (app_class), Faust's committed offsets,
commits past offsets it never delivered, aiokafka's producer for batches of our own and its
partitioner's choice. Each use says why. The versions are pinned in pyproject.toml;
tests/support/private_names.py lists each private name used here, and tests/unit/test_framework.py
checks that it still exists with the shape used: an upgrade that changes one fails there, with the
name, rather than somewhere in the stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, cast

import faust
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.partitioner import DefaultPartitioner
from faust.sensors.monitor import Monitor
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP
from mode.services import WaitResults
from mode.utils.times import want_seconds

from ..core.compiled import extension
from ..pipeline.health import FetchState
from .inline import run_until_wait, wait_for_event

log = logging.getLogger("neardup.stream")

# NEARDUP_KAFKA_HASH_PATH=/path/to/_kafka_hash.so loads that build of _kafka_hash.c instead of the
# installed one (.ci/asan: one built with AddressSanitizer).
_kafka_hash = extension(f"{__package__}._kafka_hash", "NEARDUP_KAFKA_HASH_PATH")

# How often an empty take loop looks whether its stream is stopping (it wakes at once for an event).
IDLE_CHECK_S = 0.1
# How long a batch waits for more events after its first, unless told: the consumer hands over a
# fetch's messages together, in far less.
TAKE_WITHIN_S = 0.001


class LeanStream(faust.Stream):
    """The worker's Faust streams: faust.Stream with a take loop of its own (`take_events`)."""

    def take_events(self, max_: int, within: Any = TAKE_WITHIN_S) -> AsyncGenerator[list[faust.EventT], None]:
        """Batches of at most `max_` events, each yielded once the buffer is full or `within`
        seconds after its first event. The caller acknowledges a batch (`acknowledge`) once what it
        caused is delivered (pipeline/delivery.py); never one whose handling raised or was cancelled: Faust
        commits acknowledged offsets only, and such a batch must be delivered again.

        Faust's take_events wakes every `within` whether or not anything came (through mode's
        waits: three tasks and an `asyncio.wait` each time), and then holds what came for the
        rest of that tick, which adds up to a tick to every article's latency. This loop sleeps
        until the first event of a batch, then waits `within` at most for more: the consumer
        delivers a fetch's messages together, so a short `within` still takes them in one batch."""
        batches = self._lean_batches(max_, want_seconds(within))
        self._active_agens.add(batches)  # closed at the stream's stop, as Faust's own
        return batches

    async def acknowledge(self, batch: list[faust.EventT]) -> None:
        """The batch is handled and everything it caused acknowledged by the broker: its offsets
        may be committed."""
        for event in batch:
            await self.ack(event)

    async def _lean_batches(self, max_: int, within: float) -> AsyncGenerator[list[faust.EventT], None]:
        buffer: list[faust.EventT] = []
        arrived = asyncio.Event()  # the buffer holds an event
        full = asyncio.Event()
        taken = asyncio.Event()  # the full buffer was handed over: room again

        async def add_to_buffer(value: Any) -> Any:
            event = self.current_event
            if event is None:
                raise RuntimeError("an event reached the take buffer without being current")
            buffer.append(event)
            arrived.set()
            if len(buffer) >= max_:
                full.set()
                taken.clear()
                await taken.wait()  # at most max_ events wait: the consumer waits too
            return value

        # Acknowledged once handled (`acknowledge`), never by Faust's iteration, and never again
        # after this generator closes: Faust's drainer goes on iterating the stream when an agent
        # raised, and with its acks on would acknowledge every event it passes on unhandled.
        self.enable_acks = False
        self.add_processor(add_to_buffer)
        self._enable_passive(cast(Any, aiter(self.channel)))
        try:
            while not self.should_stop:
                if not await wait_for_event(arrived, IDLE_CHECK_S):
                    continue  # nothing came: look at should_stop again
                if within and len(buffer) < max_:
                    await wait_for_event(full, within)
                batch = buffer[:]
                buffer.clear()
                arrived.clear()
                full.clear()
                taken.set()
                yield batch
        finally:
            self._processors.remove(add_to_buffer)


class LeanMonitor(Monitor):
    """Faust's monitor sensor without its per-event counters, timings and string lookups, work on
    the event loop for every event: they feed Faust's web pages, disabled here. The time a
    partition's stream last took an event is kept: Faust's consumer reads it to report streams that
    stall."""

    def on_stream_event_in(self, tp: TP, offset: int, stream: Any, event: Any) -> dict | None:
        self.stream_inbound_time[tp] = time.monotonic()
        return None  # no state: on_stream_event_out has nothing to time


def _consumer_class(
    fetch_wait_ms: int, fetch_min_bytes: int, isolation_level: str, commits: bool
) -> type[aiokafka_driver.Consumer]:
    """Faust's consumer with app_class's fetch wait, isolation level and commits."""

    class ConsumerThread(aiokafka_driver.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # read when the consumer starts its fetcher
            consumer._fetch_max_wait_ms = fetch_wait_ms
            consumer._fetch_min_bytes = fetch_min_bytes
            consumer._isolation_level = isolation_level
            return consumer

    class FetchWaitConsumer(aiokafka_driver.Consumer):
        def _new_consumer_thread(self) -> ConsumerThread:
            return ConsumerThread(self, loop=self.loop, beacon=self.beacon)

        async def _commit(self, offsets: Any) -> bool:
            # True without committing: Faust's bookkeeping moves on as after a commit
            return await super()._commit(offsets) if commits else True

        async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
            """Faust's consumer hands each message to the streams with
            `wait_first(callback(message), suspend_flow.wait())`: the callback is run inline, and
            tasks (Faust's way, so that a suspended flow abandons it) only when it has to wait. The
            callback sets no context variables (Faust sets the current event in the stream's own
            task), so running it outside a task of its own changes no other task's context."""
            # the flow suspended (a rebalance), or what mode's wait_first checks before it reports a
            # winner: the consumer stopped or crashed
            held = self.suspend_flow.is_set() or self._stopped.is_set() or self._crashed.is_set()
            if timeout is None and len(coros) == 2 and asyncio.iscoroutine(coros[0]) and not held:
                callback, other = coros
                finished, outcome = run_until_wait(callback)
                if finished:
                    if asyncio.iscoroutine(other):
                        other.close()  # never started: closed, so that it is not reported unawaited
                    return WaitResults([callback], [outcome], False)
                coros = (asyncio.ensure_future(outcome, loop=self.loop), other)
            return await super().wait_first(*coros, timeout=timeout)

    return FetchWaitConsumer


def app_class(
    fetch_wait_ms: int,
    fetch_min_bytes: int,
    isolation_level: str = "read_uncommitted",
    *,
    commits: bool = True,
    failed: Callable[[], bool] = lambda: False,
    agent_failed: Callable[[Any, BaseException], None] = lambda agent, exc: None,
) -> type[faust.App]:
    """faust.App whose consumer waits at most `fetch_wait_ms` for a fetch, instead of the 1500 ms
    Faust hard-codes. The worker reads its input and its own signatures over one connection, and
    aiokafka keeps one fetch in flight per broker: with 1500 ms, a worker with a backlog spends most
    of its time waiting for fetches (deploy/docs/benchmarks.md).
    The broker answers a fetch once it has `fetch_min_bytes` for it, or after that wait.
    `isolation_level`: read_committed under exactly-once (Faust sets it for its own transactions
    only, not used here: the stages drive their own, transactions.py), where `commits` is False:
    the transactions commit the offsets, and a commit of Faust's would race them.
    `failed`: whether the worker stops itself for a failure; `agent_failed`: what an agent that
    raises does (both the worker's Failure, given by create_app)."""

    class Transport(aiokafka_driver.Transport):
        Consumer = _consumer_class(fetch_wait_ms, fetch_min_bytes, isolation_level, commits)

    class App(faust.App):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("Stream", LeanStream)
            kwargs.setdefault("Monitor", LeanMonitor)
            super().__init__(*args, **kwargs)
            # run after the agents have stopped, while the event loop still runs
            self.at_shutdown: list[Callable[[], Awaitable[None]]] = []
            self.failed = failed
            self.agent_failed = agent_failed

        async def _on_agent_error(self, agent: Any, exc: BaseException) -> None:
            self.agent_failed(agent, exc)
            await super()._on_agent_error(agent, exc)

        async def _consumer_wait_empty(self, consumer: Any, logger: Any) -> None:
            """Faust waits here, at a stop or a rebalance, until every message delivered is
            acknowledged. A batch that failed never is (it must come back after the restart): a
            worker stopping for a failure does not wait, and commits what was acknowledged."""
            if not self.failed():
                await super()._consumer_wait_empty(consumer, logger)

        async def on_shutdown(self) -> None:
            await super().on_shutdown()
            for close in self.at_shutdown:
                await close()

        def _new_transport(self) -> Any:
            return Transport(self.conf.broker_consumer, self)

    return App


def committed_offset(app: faust.App, tp: TP) -> int | None:
    """The offset the group committed for `tp`, as the consumer knows it since the assignment (None
    when nothing, or offset 0, was committed): where Faust seeks to. Asking the broker instead would
    cost a round trip at each first batch."""
    return cast(Any, app.consumer)._committed_offset.get(tp)


def fetch_state(app: faust.App, tp: TP) -> FetchState | None:
    """The consumer's position and end in `tp` (None before the consumer runs, or when `tp` is
    not assigned). The end that counts is the one the consumer can read up to: under
    read_committed, records past the last stable offset are not readable yet. aiokafka moves the
    position past commit markers and aborted records as it fetches them, so neither counts."""
    thread = getattr(app.consumer, "_thread", None)
    consumer = getattr(thread, "_consumer", None)
    if consumer is None or not consumer._subscription.is_assigned(tp):
        return None
    state = consumer._subscription.subscription.assignment.state_value(tp)
    end = state.lso if consumer._isolation_level == "read_committed" else state.highwater
    position = state.position if state.has_valid_position else None
    handed = cast(Any, app.consumer)._read_offset.get(tp)
    return FetchState(position, end if end is not None and end >= 0 else None, handed)


async def allow_commits_past(app: faust.App, tp: TP, first: int, last: int) -> None:
    """Let Faust's commits go past offsets `first`..`last` of `tp`, which it never delivered (so never
    acknowledges): what Faust itself does for offsets a fetch skips, such as transaction markers."""
    await cast(Any, app.consumer)._add_gap(tp, first, last)


def aiokafka_producer(app: faust.App) -> Any:
    """aiokafka's producer under Faust's, for batches built here (batches.py): Faust's per-message
    send wraps each message in futures and callbacks that cost more than the decision itself."""
    return cast(Any, app.producer)._ensure_producer()


def default_partitions(producer: Any, topic: str, keys: Sequence[bytes | None]) -> list[int]:
    """The partition aiokafka's send would pick for each key: its default partitioner's choice
    (Kafka's murmur2 of the key over the topic's partitions) computed in C where built, as the
    partitioner computes it in pure Python, at a cost per key that shows at full speed; any other
    partitioner, or a message without a key (a random partition), is asked as send() would ask it."""
    partitioner = getattr(producer, "_partitioner", None)
    if _kafka_hash is None or not isinstance(partitioner, DefaultPartitioner) or None in keys:
        return [producer._partition(topic, None, None, None, key, None) for key in keys]
    # in the partitioner's order (aiokafka's _partition lists the metadata's partitions the same way)
    choices = list(producer._metadata.partitions_for_topic(topic))
    return [choices[index] for index in _kafka_hash.partitions(cast(list[bytes], keys), len(choices))]


async def broker_answers(app: faust.App, timeout: float) -> bool:
    """Whether a broker answers the producer's metadata request within `timeout` seconds. Through
    the producer's own client (public aiokafka API), so that no connection is added for it; its
    update is shared, so a check that times out leaves the request in flight for the next one."""
    update = aiokafka_producer(app).client.force_metadata_update()
    try:
        return bool(await asyncio.wait_for(update, timeout))
    except TimeoutError:
        return False


def coordinator_lookups_retried(producer: AIOKafkaProducer) -> AIOKafkaProducer:
    """`producer`, whose coordinator lookups survive a broker's loss. aiokafka asks a lookup again
    when the node it picked is not ready, but a connection that breaks under the request (the node
    died while it was asked) ends its sender for good: the transactional producer can then only
    fail, and the stage would stop the worker over a node that the cluster does without. Such a
    lookup is asked again, of a node the refreshed metadata still lists."""
    sender = cast(Any, producer)._sender
    lookup = sender._find_coordinator

    async def find_coordinator(coordinator_type: int, coordinator_key: str) -> int:
        while True:
            try:
                return cast(int, await lookup(coordinator_type, coordinator_key))
            except KafkaError as exc:
                if not isinstance(exc.__cause__, KafkaConnectionError):
                    raise
                log.warning("coordinator_lookup_retried key=%s error=%s", coordinator_key, exc.__cause__)
                await producer.client.force_metadata_update()
                await asyncio.sleep(sender._retry_backoff)

    sender._find_coordinator = find_coordinator
    return producer
