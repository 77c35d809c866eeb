"""The state port: what the index stage reads (core.dedup.StateReader) plus how it writes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from ..core.dedup import IndexedArticle, IndexUpdate, StateReader


class StateStore(StateReader, Protocol):
    """A store of indexed articles, band buckets and the exact-content map, with a parameter header."""

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
