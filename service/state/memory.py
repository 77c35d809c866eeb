"""In-memory state: for tests, the library's `neardup.open()` and the embedded mode without --state."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

from .index import DEFAULT_BUCKET_CAP, IndexState
from .port import Batch
from .tables import COPY, MEMBER, TIME


class MemoryState(IndexState):
    """The index over dicts: the same code as the RocksDB state, so the same semantics."""

    def __init__(self, bucket_cap: int = DEFAULT_BUCKET_CAP) -> None:
        # its posting lists are in a dict already: a cached copy would cost more than it spares
        super().__init__(MemoryKV(), bucket_cap=bucket_cap, posting_cache=0)


class MemoryKV:
    """KeyValue in dicts; the keys that are scanned (prefixes x, k, t) also kept sorted."""

    SCANNED = (COPY, MEMBER, TIME)

    def __init__(self) -> None:
        self._main: dict[bytes, bytes] = {}
        self._records: dict[bytes, bytes] = {}
        self._sorted: list[bytes] = []

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return [self._main.get(key) for key in keys]

    def records(self, keys: list[bytes]) -> list[bytes | None]:
        return [self._records.get(key) for key in keys]

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        if prefix[:1] in self.SCANNED:
            start = bisect.bisect_left(self._sorted, prefix)
            keys = list(itertools.takewhile(lambda key: key.startswith(prefix), self._sorted[start:]))
        else:
            keys = sorted(key for key in self._main if key.startswith(prefix))
        for key in keys:
            value = self._main.get(key)
            if value is not None:
                yield key, value

    def scan_records(self) -> Iterator[tuple[bytes, bytes]]:
        yield from sorted(self._records.items())

    def write(self, batch: Batch) -> None:
        for key, value in batch.main.items():
            scanned = key[:1] in self.SCANNED
            if value is None:
                if self._main.pop(key, None) is not None and scanned:
                    del self._sorted[bisect.bisect_left(self._sorted, key)]
            else:
                if scanned and key not in self._main:
                    bisect.insort(self._sorted, key)
                self._main[key] = value
        for key, value in batch.records.items():
            if value is None:
                self._records.pop(key, None)
            else:
                self._records[key] = value

    def close(self) -> None:
        """Nothing to release: the dicts go with the object."""

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def size_bytes(self) -> int:
        return sum(len(k) + len(v) for family in (self._main, self._records) for k, v in family.items())
