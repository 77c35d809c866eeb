"""How the index agent writes the record table's local store: a chunk of records at a time.

The record table is a Faust table (RocksDB through rocksdict, one partition) backed by its Kafka
changelog. Written as `table[key] = value`, every record costs Faust's per-key store path and one
RocksDB write, each appending to the write-ahead log with a system call of its own. The index agent
writes a whole chunk (up to 200 records) in one write batch instead: one log append, the same
contents. The changelog is sent separately (app.py), as before.

Only faust-streaming's rocksdict store (the version is pinned in pyproject.toml) is written directly;
any other store (the memory store of the unit tests) is written key by key.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

from rocksdict import WriteBatch

from .framework import table_db


def write(store: MutableMapping[bytes, bytes], writes: Sequence[tuple[bytes, bytes | None]]) -> None:
    """A chunk's writes into the store, in one RocksDB write batch (key by key for other stores);
    a value None deletes the key. The caller sends the same writes to the changelog."""
    db = table_db(store)
    if db is None:
        for key, value in writes:
            if value is None:
                store.pop(key, None)
            else:
                store[key] = value
        return
    batch = WriteBatch(raw_mode=True)
    for key, value in writes:
        if value is None:
            batch.delete(key)
        else:
            batch.put(key, value)
    db.write(batch)
