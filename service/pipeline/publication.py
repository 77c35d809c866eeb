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

import enum
from dataclasses import dataclass

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


NOTHING = Publication()


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
        return NOTHING
    fed = feed_kinds is not None and kind in feed_kinds
    return Publication(verdict=True, feed=Feed.COPY if fed else None)
