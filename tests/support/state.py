"""What the state tests share: a maker of fresh stores, everything a state holds, and what its
RocksDB files hold."""

from __future__ import annotations

from collections.abc import Callable

from neardup.state.index import IndexState
from neardup.state.port import StateStore
from neardup.state.rocks import _RECORDS, RocksKV

MakeState = Callable[[], StateStore]


def contents(state: IndexState) -> dict[bytes, bytes]:
    """Everything a state holds: its main family, and its records under "r"."""
    main = dict(state.kv.scan(b""))
    return {**main, **{b"r" + key: value for key, value in state.kv.scan_records()}}


def family_property(kv: RocksKV, name: str) -> dict[str, int]:
    """An integer RocksDB property (`rocksdb.num-files-at-level0`, `rocksdb.total-sst-files-size`)
    of each column family."""
    families = {"default": kv._db, _RECORDS: kv._records}
    return {family: handle.property_int_value(name) or 0 for family, handle in families.items()}
