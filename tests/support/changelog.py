"""A changelog in a list, for what rebuilds or restores a decider without a broker: the unit tests
and the benchmarks."""

from __future__ import annotations

from collections.abc import AsyncIterator


class ListChangelog:
    """The changelog's messages in a list (that list itself: what is appended to it shows), read
    `chunk` at a time, as topics.ChangelogReader reads the topic: what a decider rebuilds from in
    the unit tests and benchmarks."""

    def __init__(self, entries: list[tuple[bytes, bytes | None]] | None = None, chunk: int = 2000) -> None:
        self.entries = [] if entries is None else entries
        self.chunk = chunk

    async def end(self) -> int:
        return len(self.entries)

    async def read(self, end: int) -> AsyncIterator[list[tuple[bytes, bytes | None]]]:
        for start in range(0, end, self.chunk):
            yield self.entries[start : min(start + self.chunk, end)]

    async def read_after(
        self, start: int, end: int
    ) -> AsyncIterator[tuple[list[tuple[bytes, bytes | None]], int]]:
        for first in range(start, end, self.chunk):
            after = min(first + self.chunk, end)
            yield self.entries[first:after], after

    async def tombstones_kept_ms(self) -> int | None:
        return None  # a list drops nothing

    def table(self) -> dict[bytes, bytes]:
        """The records it holds: the last value per key, tombstones removing theirs."""
        latest = dict(self.entries)
        return {key: value for key, value in latest.items() if value is not None}
