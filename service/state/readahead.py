"""Reads fetched ahead for a batch of articles: the index asks the store for a batch's keys in one
multi-get per family and phase, instead of a few small ones per article.

A ReadAhead stands in front of the index's KeyValue. `fetch` reads many keys in one call and keeps
them; reads are answered from what it keeps, the rest from the store (and kept too); every write
passes through and updates what it keeps, so an article later in the batch sees the writes of the
ones before it. What it keeps is forgotten at `settle` (the batch's end) and never outlives the
store's content: a store that drops writes beneath it (the write overlay's discard) is opened anew
with a new ReadAhead (IndexState.reload).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from .port import Batch, KeyValue

_Read = Callable[[list[bytes]], list[bytes | None]]  # a multi-get


class ReadAhead:
    """A KeyValue over `base` whose reads of a batch's keys come from one multi-get per family."""

    def __init__(self, base: KeyValue) -> None:
        self.base = base
        self._main: dict[bytes, bytes | None] = {}
        self._records: dict[bytes, bytes | None] = {}

    def fetch(self, keys: Iterable[bytes] = (), records: Iterable[bytes] = ()) -> None:
        """Read the keys and records not kept yet, one multi-get per family, and keep them."""
        _fill(self._main, keys, self.base.get_many)
        _fill(self._records, records, self.base.records)

    def kept(self, key: bytes) -> bytes | None:
        """A key's value as fetched (None: absent, or not fetched)."""
        return self._main.get(key)

    def absent(self, key: bytes) -> None:
        """During a batch: the key is known to be absent (a key never written), not to be read."""
        if self._main:
            self._main[key] = None

    def settle(self) -> None:
        """The batch is done: keep nothing (memory stays bounded by one batch's keys)."""
        self._main.clear()
        self._records.clear()

    # -- the KeyValue port ---------------------------------------------------------------------

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        if not self._main:
            return self.base.get_many(keys)
        return _answer(self._main, keys, self.base.get_many)

    def records(self, keys: list[bytes]) -> list[bytes | None]:
        if not self._records:
            return self.base.records(keys)
        return _answer(self._records, keys, self.base.records)

    def write(self, batch: Batch) -> None:
        self.base.write(batch)
        if self._main:
            self._main.update(batch.main)
        if self._records:
            self._records.update(batch.records)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self.base.scan(prefix)  # every write has reached the store below

    def scan_records(self) -> Iterator[tuple[bytes, bytes]]:
        return self.base.scan_records()

    def flush(self) -> None:
        self.base.flush()

    def close(self) -> None:
        self.settle()
        self.base.close()

    def clear(self) -> None:
        self.settle()
        self.base.clear()

    def size_bytes(self) -> int:
        return self.base.size_bytes()


def _fill(kept: dict[bytes, bytes | None], keys: Iterable[bytes], read: _Read) -> None:
    missing = [key for key in dict.fromkeys(keys) if key not in kept]
    if missing:
        kept.update(zip(missing, read(missing), strict=True))


def _answer(kept: dict[bytes, bytes | None], keys: list[bytes], read: _Read) -> list[bytes | None]:
    """The keys' values from `kept`, the others read in one call (and kept)."""
    _fill(kept, keys, read)
    return [kept[key] for key in keys]
