"""In-memory state: for tests and for the embedded mode without --state."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ..core.dedup import IndexedArticle, IndexUpdate
from ..core.params import check_header
from .port import content_heir


class MemoryState:
    """Dicts behind the StateStore port; same semantics as the RocksDB adapter."""

    def __init__(self) -> None:
        self._articles: dict[str, IndexedArticle] = {}
        self._content: dict[bytes, str] = {}
        self._bands: dict[bytes, list[str]] = {}
        self._meta: dict[bytes, bytes] = {}
        self._header: dict[str, Any] | None = None
        self._seq = 0

    def open_header(self, expected: dict[str, Any]) -> None:
        if self._header is None:
            self._header = dict(expected)
        else:
            check_header(self._header, expected, "memory")

    def get(self, article_id: str) -> IndexedArticle | None:
        return self._articles.get(article_id)

    def id_for_content(self, content_hash: bytes) -> str | None:
        return self._content.get(content_hash)

    def band_members(self, key: bytes) -> Sequence[str]:
        return self._bands.get(key, ())

    def candidates(self, keys: Sequence[bytes], exclude: str, limit: int) -> list[IndexedArticle]:
        seen: dict[str, None] = {}
        for key in keys:
            for other in self._bands.get(key, ()):
                if other != exclude:
                    seen.setdefault(other, None)
                    if len(seen) >= limit:
                        return [self._articles[i] for i in seen]
        return [self._articles[i] for i in seen]

    def next_seq(self) -> int:
        return self._seq

    def apply(self, update: IndexUpdate, extra: dict[bytes, bytes] | None = None) -> None:
        article = update.article
        old = update.replaced
        if old is not None:
            for key in update.replaced_keys:
                members = self._bands.get(key)
                if members and old.article_id in members:
                    members.remove(old.article_id)
            if self._content.get(old.fingerprint.content_hash) == old.article_id:
                # exact copies share every band, so the first bucket holds any heir of the content
                members = self._bands.get(update.replaced_keys[0], []) if update.replaced_keys else []
                heir = content_heir(old, map(self._articles.get, members))
                if heir is None:
                    del self._content[old.fingerprint.content_hash]
                else:
                    self._content[old.fingerprint.content_hash] = heir
        for key in update.keys:
            members = self._bands.setdefault(key, [])
            if article.article_id not in members:
                members.append(article.article_id)
        self._content.setdefault(article.fingerprint.content_hash, article.article_id)
        self._articles[article.article_id] = article
        self._seq = max(self._seq, article.seq + 1)
        if extra:
            self._meta.update(extra)

    def articles(self) -> Iterator[IndexedArticle]:
        return iter(sorted(self._articles.values(), key=lambda a: a.seq))

    def count(self) -> int:
        return len(self._articles)

    def get_meta(self, key: bytes) -> bytes | None:
        return self._meta.get(key)

    def set_meta(self, values: dict[bytes, bytes]) -> None:
        self._meta.update(values)

    def close(self) -> None:
        pass
