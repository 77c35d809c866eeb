"""What the agents share about the stream's progress: the offsets delivered in each partition (to
notice and fill the ones the consumer skipped), when each stage last took a batch, lag and stalls,
read from the consumer (what counts as waiting and how the worker stops: pipeline/health.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from typing import Any, TypeVar

import faust

from ..pipeline.health import Failure, waiting
from ..pipeline.order import OffsetGap, in_log_order, offset_gaps
from . import framework
from .metrics import Metrics
from .topics import LogReader, StoredMessage

log = logging.getLogger("neardup.stream")
T = TypeVar("T")


@dataclass
class Progress:
    """The offsets the agents were delivered, and when each topic's agent last took a batch."""

    app: faust.App
    metrics: Metrics
    log_reader: LogReader  # reads back what the consumer went past
    failure: Failure
    # the last offset delivered to the agents in each partition, to notice a consumer that skips
    # messages (faust-streaming has open reports of events skipped around restarts)
    delivered: dict[Any, int] = field(default_factory=dict)
    # when each topic's agent last took a batch (monotonic), for the stall check
    taken_at: dict[str, float] = field(default_factory=dict)

    def took(self, topic: str) -> None:
        self.taken_at[topic] = time.monotonic()

    def expect_committed(self, batch: list[faust.EventT]) -> None:
        """The first message of an input partition after an assignment must be the one at the
        group's committed offset, where Faust seeks to: one beyond it (an event fetched before the
        rebalance and delivered after it, in faust-streaming's open reports) is a gap like any other."""
        for event in batch:
            tp = event.message.tp
            if tp not in self.delivered:
                # None when nothing (or offset 0: Faust stores it as None) was committed, and then
                # nothing is expected.
                committed = framework.committed_offset(self.app, tp)
                if committed is not None:
                    self.delivered[tp] = committed - 1

    async def in_log_order(
        self,
        batch: list[faust.EventT],
        level: int,
        delivered: Callable[[faust.EventT], T],
        read_back: Callable[[Any, StoredMessage], T | None],
    ) -> tuple[list[OffsetGap], list[tuple[Any, int, T]]]:
        """The batch as (partition, offset, `delivered(event)`), in log order: the messages the
        consumer went past without delivering them (faust-streaming has open reports of events
        skipped around restarts) read back from Kafka, as `read_back(partition, message)` (None: left out),
        each gap's before the message that revealed it. Also the gaps, which the batch's
        acknowledgement lets the commits go past. A gap is logged at `level`: on a topic written
        in transactions each commit marker makes one, which holds nothing.

        A gap that cannot be read back (the broker does not answer) stops the worker, so that it
        restarts from its last commit rather than go on without those messages. Each gap is read
        on its own: under exactly-once a commit marker leaves a gap after nearly every sign
        transaction, between messages already delivered, and one read from a batch's first gap to
        its last would fetch all of those again."""
        entries = [(event.message.tp, event.message.offset, delivered(event)) for event in batch]
        gaps = offset_gaps(self.delivered, ((tp, offset) for tp, offset, _ in entries))
        for gap in gaps:
            self.metrics.offset_gaps.labels(gap.partition.topic).inc()
            log.log(level, "offset_gap topic=%s partition=%d expected=%d got=%d", *_where(gap))
        fills: list[tuple[Any, int, T]] = []
        for gap in gaps:
            tp = gap.partition
            try:
                found = await self.log_reader.read(tp.topic, tp.partition, gap.expected, gap.got)
            except Exception:
                self.failure.fail("offset_gap_unreadable: stopping the worker", exc_info=True)
                raise
            # messages in a gap were skipped by the consumer; none: a transaction marker, or removed
            self.metrics.offset_gap_messages.labels(tp.topic).inc(len(found))
            filled = "offset_gap_filled topic=%s partition=%d expected=%d got=%d read=%d"
            log.log(logging.WARNING if found else logging.INFO, filled, *_where(gap), len(found))
            fills += [(tp, m.offset, item) for m in found if (item := read_back(tp, m)) is not None]
        return gaps, in_log_order(entries, gaps, fills) if gaps else entries

    async def hold_if_failed(self) -> None:
        """After a failure no agent takes another batch: this waits until the worker's stop cancels
        it. Faust replaces an agent that raised with one that goes on past the failed batch, and
        Faust's commits would follow it there: its check for an unacknowledged offset below the
        acknowledged ones is skipped while the group has committed nothing."""
        if self.failure.failed:
            await asyncio.Event().wait()

    async def acknowledge(self, stream: Any, batch: list[faust.EventT], gaps: list[OffsetGap]) -> None:
        """`batch` handled and everything it caused delivered: its offsets may be committed, and
        those of the `gaps` it filled (Faust never delivered them, so never acknowledges them);
        consumer lag recorded per partition, from the batch's last event in each. Nothing is
        acknowledged after a failure: the restart resumes from the batch that failed, and a batch
        after it committed would be skipped."""
        if self.failure.failed:
            return
        for gap in gaps:
            await framework.allow_commits_past(self.app, gap.partition, gap.expected, gap.got - 1)
        await stream.acknowledge(batch)
        for tp, offset in {event.message.tp: event.message.offset for event in batch}.items():
            if (highwater := self.app.consumer.highwater(tp)) is not None:
                self.metrics.lag.labels(tp.topic, str(tp.partition)).set(max(highwater - offset - 1, 0))

    def stalled(self, limit: float, busy: Set[str] = frozenset()) -> str | None:
        """Why the worker is wedged, if it is: a partition with records waiting (`waiting`) that
        its agent has not taken a batch from for `limit` seconds (but the `busy` topics, whose
        agents are known to be at work on their batch or waiting for the broker)."""
        now = time.monotonic()
        for tp in self.app.consumer.assignment():
            taken = self.taken_at.get(tp.topic, now)
            if tp.topic in busy or now - taken <= limit:
                continue
            state = framework.fetch_state(self.app, tp)
            count = 0 if state is None else waiting(state, self.delivered.get(tp))
            if count:
                return f"{tp.topic}:{tp.partition}: {count} waiting, none taken for {now - taken:.0f} s"
        return None


def _where(gap: OffsetGap) -> tuple[str, int, int, int]:
    return gap.partition.topic, gap.partition.partition, gap.expected, gap.got
