"""A fetched batch put in log order by the agents' one gap read-back (stream/progress.py
Progress.in_log_order), without a broker: the offsets the consumer went past read back and put
before the message that revealed them, each agent's own form of a message kept."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from faust.types import TP

from neardup.stream.metrics import Metrics
from neardup.stream.progress import Progress
from neardup.stream.topics import StoredMessage

A, B = TP("in", 0), TP("in", 1)  # two partitions, as the consumer names them


class LogBehind:
    """What the consumer went past, as LogReader reads it back (or a broker that does not answer)."""

    def __init__(self, messages: dict[TP, list[StoredMessage]], answers: bool = True) -> None:
        self.messages, self.answers, self.reads = messages, answers, list[tuple[Any, ...]]()

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[StoredMessage]:
        self.reads.append((topic, partition, start, end))
        if not self.answers:
            raise ConnectionError("no broker")
        return [m for m in self.messages.get(TP(topic, partition), []) if start <= m.offset < end]


def event(tp: TP, offset: int) -> Any:
    return SimpleNamespace(
        message=SimpleNamespace(tp=tp, offset=offset), value=f"{tp.partition}@{offset}".encode()
    )


def progress_over(reader: LogBehind, failures: list[str]) -> Progress:
    failure = SimpleNamespace(fail=lambda message, exc_info=False: failures.append(message))
    return Progress(cast(Any, None), Metrics(), cast(Any, reader), cast(Any, failure))


def stored(offset: int, value: bytes | None) -> StoredMessage:
    return StoredMessage(offset, None, value, None)


async def test_gaps_are_read_back_into_their_place_per_partition() -> None:
    behind = {A: [stored(1, b"A1"), stored(2, None)], B: [stored(6, b"B6")]}
    reader, failures = LogBehind(behind), list[str]()
    progress = progress_over(reader, failures)
    progress.delivered.update({A: 0, B: 5})
    batch = [event(A, 3), event(B, 7), event(A, 4)]
    gaps, ordered = await progress.in_log_order(
        batch,
        20,
        lambda e: e.value,
        lambda tp, found: found.value,  # a tombstone left out
    )
    assert [(gap.partition, gap.expected, gap.got) for gap in gaps] == [(A, 1, 3), (B, 6, 7)]
    assert reader.reads == [("in", 0, 1, 3), ("in", 1, 6, 7)]  # each gap on its own
    assert ordered == [(A, 1, b"A1"), (A, 3, b"0@3"), (B, 6, b"B6"), (B, 7, b"1@7"), (A, 4, b"0@4")]
    assert progress.delivered == {A: 4, B: 7}
    assert failures == []


async def test_a_batch_without_gaps_reads_nothing() -> None:
    reader = LogBehind({})
    progress = progress_over(reader, [])
    gaps, ordered = await progress.in_log_order([event(A, 0), event(A, 1)], 20, lambda e: e.value, _never)
    assert (gaps, reader.reads) == ([], [])
    assert ordered == [(A, 0, b"0@0"), (A, 1, b"0@1")]


async def test_a_gap_that_cannot_be_read_back_stops_the_worker() -> None:
    failures: list[str] = []
    progress = progress_over(LogBehind({}, answers=False), failures)
    progress.delivered[A] = 0
    with pytest.raises(ConnectionError):
        await progress.in_log_order([event(A, 2)], 20, lambda e: e.value, _never)
    assert failures == ["offset_gap_unreadable: stopping the worker"]


def _never(tp: Any, found: StoredMessage) -> bytes:
    raise AssertionError("nothing was read back")
