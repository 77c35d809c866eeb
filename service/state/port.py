"""The state port: what the index stage reads (core.dedup.StateReader) plus how it writes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from ..core.dedup import IndexedArticle, IndexUpdate, StateReader


class StateStore(StateReader, Protocol):
    """A store of indexed articles, band buckets and the exact-content map, with a parameter header."""

    def band_members(self, key: bytes) -> Sequence[str]:
        """The article ids of one bucket, in the order they joined it; for tools and tests."""
        ...

    def apply(self, update: IndexUpdate, extra: dict[bytes, bytes] | None = None) -> None:
        """Apply one update atomically, with optional extra keys (e.g. consumed offsets)."""
        ...

    def open_header(self, expected: dict[str, Any]) -> None:
        """Write the header on empty state; otherwise raise IncompatibleState on any difference."""
        ...

    def articles(self) -> Iterator[IndexedArticle]: ...

    def count(self) -> int: ...

    def get_meta(self, key: bytes) -> bytes | None: ...

    def set_meta(self, values: dict[bytes, bytes]) -> None: ...

    def close(self) -> None: ...


def content_heir(old: IndexedArticle, others: Iterable[IndexedArticle | None]) -> str | None:
    """The article that takes over `old`'s content in the content map when `old` is replaced: the
    earliest remaining article with the same content, as a rebuild from the records would choose."""
    same = [
        other
        for other in others
        if other is not None
        and other.article_id != old.article_id
        and other.fingerprint.content_hash == old.fingerprint.content_hash
    ]
    return min(same, key=lambda a: a.seq).article_id if same else None
