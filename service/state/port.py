"""The state port: what the index stage reads (core.dedup.StateReader) plus how it writes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from ..core.dedup import IndexedArticle, IndexUpdate, StateReader
from .index import Counts, IndexStats


class StateStore(StateReader, Protocol):
    """Indexed articles, band buckets, content map and clusters, with a parameter header."""

    counts: Counts

    def band_members(self, key: bytes) -> Sequence[str]:
        """The article ids of one bucket, in the order they joined it; for tools and tests."""
        ...

    def apply(
        self, update: IndexUpdate, extra: dict[bytes, bytes] | None = None, record: bytes | None = None
    ) -> None:
        """Apply one update atomically, with optional extra keys (e.g. consumed offsets); `record`:
        the article's encoded record when the caller has it."""
        ...

    def delete(self, article_id: str, extra: dict[bytes, bytes] | None = None) -> IndexedArticle | None:
        """Delete an article, atomically with `extra`; None when it is not held."""
        ...

    def expire(self, cutoff_ms: int) -> list[IndexedArticle]:
        """Remove the articles older than `cutoff_ms`; returns them."""
        ...

    def open_header(self, expected: dict[str, Any]) -> None:
        """Write the header on empty state; otherwise raise IncompatibleState on any difference."""
        ...

    def articles(self) -> Iterator[IndexedArticle]: ...

    def count(self) -> int: ...

    def stats(self) -> IndexStats: ...

    def get_meta(self, key: bytes) -> bytes | None: ...

    def set_meta(self, values: dict[bytes, bytes]) -> None: ...

    def compact(self) -> None: ...

    def close(self) -> None: ...
