"""What the state tests share: a maker of fresh stores, everything a state holds, what one bucket
and one content map entry hold, and what its RocksDB files hold."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from neardup.state.index import IndexState
from neardup.state.port import KeyValue, StateStore
from neardup.state.rocks import _RECORDS, RocksKV
from neardup.state.tables import BAND

MakeState = Callable[[], StateStore]


def flush(kv: RocksKV) -> None:
    """Both families' memtables written to their files (what a benchmark counts in a write's cost)."""
    kv._db.flush()
    kv._records.flush()


def contents(state: IndexState) -> dict[bytes, bytes]:
    """Everything a state holds: its main family, and its records under "r"."""
    main = dict(state.kv.scan(b""))
    return {**main, **{b"r" + key: value for key, value in state.kv.scan_records()}}


def bucket_seqs(kv: KeyValue, key: bytes) -> list[int]:
    """The seqs in one bucket, in the order they joined it."""
    (stored,) = kv.get_many([BAND + key])
    return np.frombuffer(stored, dtype=">u8").tolist() if stored else []


def band_members(state: IndexState, key: bytes) -> list[str]:
    """The ids in one bucket, in the order they joined it."""
    held = state.versions.arrivals(bucket_seqs(state.kv, key))
    return [article.article_id for article in held if article is not None]


def id_for_content(state: IndexState, content_hash: bytes) -> str | None:
    """The id of the article that stands for a content (its holder), None when it is not held."""
    holder = state.holder_of(content_hash)
    return None if holder is None else holder.article_id


def family_property(kv: RocksKV, name: str) -> dict[str, int]:
    """An integer RocksDB property (`rocksdb.num-files-at-level0`, `rocksdb.total-sst-files-size`)
    of each column family."""
    families = {"default": kv._db, _RECORDS: kv._records}
    return {family: handle.property_int_value(name) or 0 for family, handle in families.items()}
