"""neardup.stream.record_store: the record table's RocksDB written a chunk at a time, other stores
key by key. (Crash recovery through Faust and the changelog: the SIGKILL integration test.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict

from neardup.stream import framework, record_store


class RocksLikeStore(dict[bytes, bytes]):
    """What record_store reads of faust's RocksDB store: `use_rocksdict` and `_db_for_partition`,
    over a real rocksdict database. As a mapping it stays empty: writes must not go through it."""

    use_rocksdict = True

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.db = Rdict(str(path), Options(raw_mode=True))
        self.opened: list[int] = []

    def _db_for_partition(self, partition: int) -> Rdict:
        self.opened.append(partition)
        return self.db


def chunk(count: int, size: int = 3500) -> list[tuple[bytes, bytes]]:
    return [(f"a{n:05d}".encode(), bytes([n % 251]) * size) for n in range(count)]


def test_a_chunk_goes_to_partition_zero_in_one_write(tmp_path: Path) -> None:
    store = RocksLikeStore(tmp_path / "db")
    writes = [*chunk(300), (b"a00007", b"newer")]  # a later write of a key wins, as key by key
    record_store.write(store, writes)
    assert dict(store) == {}  # not key by key through the mapping
    assert store.opened == [framework.TABLE_PARTITION]  # one database, looked up once per chunk
    assert {key: store.db[key] for key, _ in writes} == dict(writes)
    store.db.close()
    reopened = Rdict(str(tmp_path / "db"), Options(raw_mode=True))  # the log kept it
    assert reopened[b"a00007"] == b"newer" and reopened[b"a00299"] == writes[299][1]
    reopened.close()


def test_other_stores_are_written_key_by_key() -> None:
    memory: dict[bytes, bytes] = {}
    writes = [*chunk(5, size=10), (b"a00001", b"newer")]
    record_store.write(memory, writes)
    assert memory == dict(writes)

    class NotRocksdict:
        use_rocksdict = False

        def _db_for_partition(self, partition: int) -> Any:
            raise AssertionError("the python-rocksdb driver is not written directly")

    assert framework.table_db(NotRocksdict()) is None
