"""The state ports and their types: what the index stage reads (core.dedup.StateReader) plus how it
writes (StateStore, implemented by index.py's IndexState) and the value types it hands out (Counts,
IndexStats); the ordered key-value store under the index (KeyValue, taking a Batch), implemented by
memory.py, rocks.py and overlay.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from ..core.dedup import IndexedArticle, IndexUpdate, StateReader


@dataclass
class Counts:
    """What the index holds and what it removed, kept with it (the stats and the gauges)."""

    articles: int = 0
    clusters: int = 0
    buckets: int = 0
    postings: int = 0  # anchor posting lists held
    boilerplate: int = 0  # of them, those at their cap: propose no candidate
    expired: int = 0
    deleted: int = 0
    newest_ms: int | None = None
    expired_before_ms: int | None = None  # the cutoff of the last expiry pass
    # buckets by member count (index: members): the largest bucket, exact after removals, without
    # a scan of every bucket (None: a state written without it, counted once at open)
    bucket_sizes: list[int] | None = None

    def encode(self) -> bytes:
        return orjson.dumps(self.__dict__)

    def resized(self, before: int, after: int) -> None:
        """A bucket went from `before` members to `after` (0: absent)."""
        sizes = self.bucket_sizes
        assert sizes is not None
        if after >= len(sizes):
            sizes.extend([0] * (after + 1 - len(sizes)))
        if before:
            sizes[before] -= 1
        if after:
            sizes[after] += 1

    @property
    def largest_bucket(self) -> int:
        sizes = self.bucket_sizes or []
        return next((members for members in range(len(sizes) - 1, 0, -1) if sizes[members]), 0)

    @classmethod
    def decode(cls, data: bytes | None) -> Counts:
        return cls() if data is None else cls(**orjson.loads(data))


@dataclass(frozen=True)
class IndexStats:
    """`neardup stats`: what the state holds."""

    articles: int
    clusters: int
    buckets: int
    largest_bucket: int
    anchor_postings: int
    boilerplate_anchors: int
    oldest_ms: int | None
    newest_ms: int | None
    expired: int
    deleted: int
    bytes_on_disk: int
    bucket_cap: int
    anchor_cap: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class StateStore(StateReader, Protocol):
    """Indexed articles, band buckets, content map and clusters, with a parameter header."""

    counts: Counts

    def apply(self, update: IndexUpdate, record: bytes | None = None) -> None:
        """Apply one update atomically; `record`: the article's encoded record when the caller
        has it."""

    def delete(self, article_id: str) -> IndexedArticle | None:
        """Delete an article atomically; None when it is not held."""

    def expire(self, cutoff_ms: int) -> list[IndexedArticle]:
        """Remove the articles older than `cutoff_ms`; returns them."""

    def expire_markers(self, cutoff_ms: int) -> list[str]:
        """Remove the deletion markers older than `cutoff_ms`; returns their ids."""

    def deletion_marker(self, article_id: str) -> bytes | None:
        """A deleted id's marker as stored (its last version, the deletion's time); None: none."""

    def open_header(self, expected: dict[str, Any]) -> None:
        """Write the header on empty state; otherwise raise IncompatibleState on any difference."""

    def articles(self) -> Iterator[IndexedArticle]: ...

    def stats(self) -> IndexStats: ...

    def get_meta(self, key: bytes) -> bytes | None: ...

    def set_meta(self, values: dict[bytes, bytes]) -> None: ...

    def compact(self) -> None: ...

    def close(self) -> None: ...


class KeyValue(Protocol):
    """The store under the index: a main family and a records family, ordered by key."""

    def get_many(self, keys: list[bytes]) -> list[bytes | None]: ...

    def records(self, keys: list[bytes]) -> list[bytes | None]: ...

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The main family's entries whose key starts with `prefix`, in key order."""

    def scan_records(self) -> Iterator[tuple[bytes, bytes]]: ...

    def write(self, batch: Batch) -> None: ...

    def close(self) -> None: ...

    def clear(self) -> None: ...

    def size_bytes(self) -> int: ...


@dataclass
class Batch:
    """Writes collected for one atomic write: key → value, None deleting it. Reads during an
    operation look here first, so that its later steps see its earlier ones."""

    main: dict[bytes, bytes | None] = field(default_factory=dict)
    records: dict[bytes, bytes | None] = field(default_factory=dict)
    buckets_written: bool = False  # whether a bucket is among `main`
    postings_written: list[list[bytes]] = field(default_factory=list)  # posting lists in `main`
    times_written: list[bytes] = field(default_factory=list)  # time-order keys in `main`
    # the copy and member keys a run adds, which a later removal in it scans for (first_key)
    scanned: list[bytes] = field(default_factory=list)

    def put(self, key: bytes, value: bytes) -> None:
        self.main[key] = value

    def delete(self, key: bytes) -> None:
        self.main[key] = None
