"""A changelog in a list, for what rebuilds or restores a decider without a broker (the unit tests
and the benchmarks), and one that keeps what a shard writes, in order."""

from __future__ import annotations

from collections.abc import AsyncIterator

Entries = list[tuple[bytes, bytes | None]]  # changelog messages in order: key, value (None: a tombstone)


def compacted(entries: Entries) -> dict[bytes, bytes]:
    """The records a changelog holds: the last value per key, tombstones removing theirs."""
    latest = dict(entries)
    return {key: value for key, value in latest.items() if value is not None}


class RecordedChangelog(dict[bytes, bytes]):
    """The changelog as the shard writes it (IndexShard's `changelog`), every write kept in order
    in `entries`."""

    def __init__(self, entries: Entries) -> None:
        super().__init__()
        self.entries = entries

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.entries.append((key, value))
        super().__setitem__(key, value)

    def __delitem__(self, key: bytes) -> None:
        self.entries.append((key, None))
        self.pop(key, None)


class ListChangelog:
    """The changelog's messages in a list (that list itself: what is appended to it shows), read
    `chunk` at a time, as topics.ChangelogReader reads the topic: what a decider rebuilds from in
    the unit tests and benchmarks."""

    def __init__(self, entries: list[tuple[bytes, bytes | None]] | None = None, chunk: int = 2000) -> None:
        self.entries = [] if entries is None else entries
        self.chunk = chunk

    async def end(self) -> int:
        return len(self.entries)

    async def read_after(
        self, start: int | None, end: int
    ) -> AsyncIterator[tuple[list[tuple[bytes, bytes | None]], int]]:
        for first in range(start or 0, end, self.chunk):
            after = min(first + self.chunk, end)
            yield self.entries[first:after], after

    async def tombstones_kept_ms(self) -> int | None:
        return None  # a list drops nothing

    def table(self) -> dict[bytes, bytes]:
        """The records it holds: the last value per key, tombstones removing theirs."""
        return compacted(self.entries)
