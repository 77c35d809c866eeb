"""Offset gaps: how the worker notices offsets the consumer went past without delivering them,
and puts the messages read back for them in their place in the log.

Separate from the stages, which get their messages already in log order, and from the wire format:
both agents use these on (partition, offset) pairs, whatever the topic and the payload.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")


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
