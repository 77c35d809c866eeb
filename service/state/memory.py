"""In-memory state: for tests and for the embedded mode without --state."""

from __future__ import annotations

from .index import DEFAULT_BUCKET_CAP, IndexState, MemoryKV


class MemoryState(IndexState):
    """The index over dicts: the same code as the RocksDB state, so the same semantics."""

    def __init__(self, bucket_cap: int = DEFAULT_BUCKET_CAP) -> None:
        super().__init__(MemoryKV(), bucket_cap=bucket_cap)
