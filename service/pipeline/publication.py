"""What each decision publishes, decided in one place for every mode: the worker renders it as Kafka
records (verdicts, filtered feed, dead letters), embedded mode as lines of its files, the library
as a return value or an exception. A rule changed here changes in all three.

The rules:
- An input the index could not handle publishes its dead letter, and nothing else.
- A deletion publishes the id's removal whatever the index held (a tombstone on the verdicts, a
  deletion line in a verdict file): a consumer with a compacted view drops the id too, one the
  index had already expired or never saw included, and a removal published again is harmless.
  The filtered feed drops the id too, unless the article removed is one the feed never carried.
- A verdict is published under its article's id; the feed carries the input as it came when the
  verdict's kind is one the feed passes.
- An input the index already applied (recognised by where it came from: "replayed", or replaced
  since: "stale") publishes its stored answer again under at-least-once, where its first answer
  may not have reached the broker; under exactly-once the index holds only committed decisions,
  so its answer was committed already and nothing is published.
"""

from __future__ import annotations

import collections
import enum
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from .shard import WHOLE_MESSAGE, Decided
from .sign import PROCESSING_FAILED
from .wire import Headers, Provenance, decode_signed, feed_inputs, unpack_signed

Sent = tuple[bytes, bytes | None]  # (article id, value), a value None the id's removal
REPLAYS = frozenset({"replayed", "stale"})  # an input the index had already applied
DELETES = frozenset({"deleted", "unknown_delete"})


class Feed(enum.Enum):
    """What the filtered feed gets for a decision."""

    COPY = "copy"  # the input message as it came
    REMOVAL = "removal"  # the id's removal (a tombstone, a deletion line)


@dataclass(frozen=True)
class Publication:
    """What one decision publishes (nothing, by default)."""

    verdict: bool = False
    removal: bool = False
    feed: Feed | None = None
    dead_letter: bool = False
    answered_before: bool = False  # a replay whose answer is already published: nothing again


def publication(
    status: str,
    kind: str | None,
    *,
    deletion: bool,
    has_verdict: bool,
    feed_kinds: frozenset[str] | None,
    replays_republished: bool,
) -> Publication:
    """What a decision of `status` publishes. `kind`: the verdict's kind, or for a deletion the kind
    of the article it removed (None: none was held); `feed_kinds`: what the filtered feed passes
    (None: no feed); `replays_republished`: whether an input already applied is answered again
    (at-least-once) or not (exactly-once)."""
    if status == "error":
        return Publication(dead_letter=True)
    if status in REPLAYS and not replays_republished:
        return Publication(answered_before=True)
    if deletion:
        carried = status != "deleted" or kind in (feed_kinds or ())
        return Publication(removal=True, feed=Feed.REMOVAL if feed_kinds is not None and carried else None)
    if not has_verdict:
        return Publication()
    fed = feed_kinds is not None and kind in feed_kinds
    return Publication(verdict=True, feed=Feed.COPY if fed else None)


class Undecided(NamedTuple):
    """What a record the index stage could not handle is dead-lettered with: its bytes, and the input
    message it came from when that is known (else None: it goes under its signatures message)."""

    payload: bytes
    source: Provenance | None


def undecided(entry: Decided, message: bytes) -> Undecided:
    """`entry`'s dead letter from the signatures `message` it came in: the signed record (the whole
    message when it could not be unpacked); for a record the decider process failed on in its
    decision (isolated, and decodable: it has an id), its input message, the message itself when
    the record carries it (the filtered feed's)."""
    signed = message if entry.record == WHOLE_MESSAGE else unpack_signed(message)[entry.record]
    if entry.reason != PROCESSING_FAILED or entry.article_id is None:
        return Undecided(signed, None)
    original = feed_inputs(signed).get(0, (signed, ()))[0]
    return Undecided(original, decode_signed(signed).provenance)


@dataclass
class BatchPublication:
    """What a batch of decisions publishes, in their order, for a mode to render: its records per
    output and what it counts (per label), so that the rule's application is tested without one."""

    verdicts: list[Sent] = field(default_factory=list)  # verdicts and removals
    feed: list[Sent] = field(default_factory=list)  # input messages as they came, and removals
    feed_headers: list[Headers] = field(default_factory=list)  # each feed message's
    errors: list[tuple[Decided, Undecided]] = field(default_factory=list)  # each a dead letter
    # ("replays", status), ("deletes", status), ("verdicts", kind): a replayed verdict is not counted
    # again, as it was (with its latency) when it was first decided
    counts: collections.Counter[tuple[str, str | None]] = field(default_factory=collections.Counter)
    latencies_s: list[float] = field(default_factory=list)  # of the verdicts decided
    expired: int = 0  # articles the retention window removed meanwhile


def batch_publication(
    entries: Iterable[Decided],
    messages: Sequence[tuple[int, bytes]],
    *,
    feed_kinds: frozenset[str] | None,
    replays_republished: bool,
) -> BatchPublication:
    """What `entries` publish (`publication`), the feed's copies read from the signatures
    `messages` they were decided from ((offset, value): the decisions do not carry them back),
    each message read at its first copy only; a dead letter's bytes from there too."""
    out = BatchPublication()
    values = dict(messages)
    inputs = functools.cache(lambda offset: feed_inputs(values[offset]))
    rule = functools.partial(publication, feed_kinds=feed_kinds, replays_republished=replays_republished)
    for entry in entries:
        has_verdict = entry.verdict is not None and entry.article_id is not None
        what = rule(entry.status, entry.kind, deletion=entry.deletion, has_verdict=has_verdict)
        if what.dead_letter:
            out.errors.append((entry, undecided(entry, values[entry.offset])))
            continue
        if entry.status in REPLAYS:
            out.counts["replays", entry.status] += 1
        if what.answered_before:
            continue
        out.expired += entry.expired
        if entry.article_id is None:
            continue
        key = entry.article_id.encode()
        if what.removal:
            if entry.status in DELETES:
                out.counts["deletes", entry.status] += 1
            out.verdicts.append((key, None))
        elif what.verdict:
            if entry.status != "replayed":
                out.counts["verdicts", entry.kind] += 1
                if entry.latency_ms is not None:
                    out.latencies_s.append(entry.latency_ms / 1000.0)
            out.verdicts.append((key, entry.verdict))
        if what.feed is Feed.REMOVAL:
            out.feed.append((key, None))
            out.feed_headers.append(())
        elif what.feed is Feed.COPY and (found := inputs(entry.offset).get(entry.record)):
            out.feed.append((key, found[0]))
            out.feed_headers.append(found[1])
    return out
