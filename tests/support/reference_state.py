"""The numpy reference of the index's compiled loops (service/core/_sketch.c) that state/tables.py
calls, which the tests compare with the compiled results:

    merge_buckets                   Buckets.lookup's merge of a band lookup's buckets
                                    (_sketch.merge_buckets)
    read_varints                    state/records.py's reading of a record's varints
                                    (_sketch.varints)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

# Bucket entries up to which merge_buckets merges them with a dict rather than numpy.
SMALL_MERGE = 256
_SEQ_DTYPE = np.dtype(">u8")


def merge_buckets(found: Sequence[bytes | None], count: int, small: int = SMALL_MERGE) -> list[int]:
    """The distinct seqs of stored buckets (None: absent; 8-byte big-endian seqs), in order of first
    appearance, at most `count`: by dict up to `small` entries, by numpy beyond."""
    stored = b"".join(data for data in found if data)
    seqs = np.frombuffer(stored, dtype=_SEQ_DTYPE)
    if seqs.size <= small:
        return list(dict.fromkeys(seqs.tolist()))[:count]
    distinct, first = np.unique(seqs, return_index=True)
    return cast(list[int], distinct[np.argsort(first, kind="stable")][:count].tolist())


def read_varints(data: bytes, position: int, count: int) -> tuple[tuple[int, ...], int]:
    """`count` unsigned LEB128 varints from `position`, and the position after them."""
    values = []
    for _ in range(count):
        value = shift = 0
        while True:
            if position >= len(data):
                raise ValueError("a varint runs past the end of data")
            if shift > 63:
                raise ValueError("a varint runs past 64 bits")
            byte = data[position]
            position += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        values.append(value)
    return tuple(values), position
