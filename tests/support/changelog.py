"""A changelog in a list, for what rebuilds or restores a decider without a broker (the unit tests
and the benchmarks), and one compacted as a dict."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

Entries = list[tuple[bytes, bytes | None]]  # changelog messages in order: key, value (None: a tombstone)


def compacted(entries: Entries) -> dict[bytes, bytes]:
    """The records a changelog holds: the last value per key, tombstones removing theirs."""
    table = ChangelogTable()
    table.extend(entries)
    return table


class ChangelogTable(dict[bytes, bytes]):
    """The changelog compacted as it is written (IndexShard's `changelog`, or `compacted`): a
    record set, or removed by its tombstone."""

    def append(self, entry: tuple[bytes, bytes | None]) -> None:
        key, value = entry
        if value is None:
            self.pop(key, None)
        else:
            self[key] = value

    def extend(self, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        for entry in entries:
            self.append(entry)


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
