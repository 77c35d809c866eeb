"""The log's order, whatever delivers the messages: offset gaps (offsets the consumer went past
without delivering them), the messages read back for them put in their place, and the hand-off
that decides this worker's own signatures messages as their sends are acknowledged, in the shard's
order.

Separate from the stages, which get their messages already in log order, and from the wire format:
both agents use these on (partition, offset) pairs, whatever the topic and the payload.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")
# Signatures messages waiting for their acknowledgement to be handed off (each up to a sign batch).
# A hand-off that falls this far behind is no quicker than the consumer, which delivers them anyway.
HANDOFF_QUEUE = 16


class OffsetGap(NamedTuple):
    """Messages of one partition that the consumer went past without delivering them."""

    partition: Any  # the consumer's topic-partition
    expected: int  # the first offset not delivered
    got: int  # the offset delivered instead


def offset_gaps(last: dict[Any, int], delivered: Iterable[tuple[Any, int]]) -> list[OffsetGap]:
    """Gaps in `delivered` ((partition, offset) in delivery order), given the last offset delivered
    before for each partition (`last`, updated in place). Going back is no gap (re-delivery after a
    restart or rebalance); going forward by more than one is (on a topic written in transactions,
    a commit marker makes one too: read back, it holds nothing)."""
    gaps = []
    for partition, offset in delivered:
        before = last.get(partition)
        if before is not None and offset > before + 1:
            gaps.append(OffsetGap(partition, before + 1, offset))
        last[partition] = offset
    return gaps


def in_log_order(
    messages: Sequence[tuple[Any, int, T]], gaps: Sequence[OffsetGap], fills: Sequence[tuple[Any, int, T]]
) -> list[tuple[Any, int, T]]:
    """`messages` ((partition, offset, payload), as delivered) with `fills`, the messages read for
    `gaps`, put back where they belong: each gap's before the message that revealed it."""
    before: dict[tuple[Any, int], list[tuple[Any, int, T]]] = {(gap.partition, gap.got): [] for gap in gaps}
    for fill in sorted(fills, key=lambda entry: entry[1]):
        partition, offset, _ = fill
        gap = next((g for g in gaps if g.partition == partition and g.expected <= offset < g.got), None)
        if gap is None:
            raise ValueError(f"message at offset {offset} of {partition} fills no gap of {list(gaps)}")
        before[(gap.partition, gap.got)].append(fill)
    ordered: list[tuple[Any, int, T]] = []
    for message in messages:
        ordered += before.pop((message[0], message[1]), [])
        ordered.append(message)
    return ordered


def following_run(after: int, messages: Sequence[tuple[int, T]]) -> list[tuple[int, T]]:
    """Of `messages` ((offset, payload), in offset order), those that can be decided right after the
    offset `after` without skipping one: past the ones at or before it (decided already), the
    offsets that follow it one by one. (Under exactly-once a commit marker follows each sign
    transaction, and which offset it took is not known here: the consumer brings what follows.)"""
    run: list[tuple[int, T]] = []
    for message in messages:
        if message[0] <= after:
            continue
        if message[0] != after + 1 + len(run):
            break
        run.append(message)
    return run


class HandOff:
    """Signatures messages this worker sent, decided as soon as the broker acknowledges them.

    Through the consumer, a signatures message reaches the index agent one fetch round trip after
    its send: about as long again as the input's own fetch. The acknowledgement gives its offset, so while
    this worker owns the shard it can be decided at once, in the shard's order: only when it follows
    the last message decided (`following_run`); otherwise (another worker's messages first,
    the shard elsewhere, a failed send) the consumer brings it, as it brings every message anyway.

    The queue holds `maxsize` messages: when it is full, the message is not handed off (nor are
    those after it, which no longer follow the last one decided) and the consumer brings it. The
    hand-off only saves latency; making the sign stage wait for it instead would tie the input's
    pace to the decisions', which the consumer's path keeps apart."""

    def __init__(self, maxsize: int = HANDOFF_QUEUE) -> None:
        self._sent: asyncio.Queue[tuple[Any, bytes]] = asyncio.Queue(maxsize)

    def submit(self, sent: Any, pack: bytes) -> None:
        """`sent`: what Topic.send returned, awaitable for the message's metadata."""
        # a full queue: the message is left to the consumer, which brings it anyway
        if asyncio.isfuture(sent):
            with contextlib.suppress(asyncio.QueueFull):
                self._sent.put_nowait((sent, pack))

    async def run(self, decide: Callable[[list[tuple[int, bytes]]], Awaitable[None]]) -> None:
        """In send order; whatever is acknowledged meanwhile is decided together (one pipelined
        request to the decider, as a batch from the consumer would be)."""
        while True:
            waiting = [await self._sent.get()]
            while not self._sent.empty():
                waiting.append(self._sent.get_nowait())
            messages: list[tuple[int, bytes]] = []
            for sent, pack in waiting:
                try:
                    metadata = await sent
                except Exception:  # the send failed: the sign agent's own await reports it
                    break
                messages.append((metadata.offset, pack))
            if messages:
                await decide(messages)
