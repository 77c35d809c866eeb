"""The numpy reference of the index's compiled loops (service/core/_sketch.c) that state/tables.py
calls, which the tests compare with the compiled results:

    merge_buckets                   Buckets.lookup's merge of a band lookup's buckets
                                    (_sketch.merge_buckets)
    read_varints                    state/records.py's reading of a record's varints
                                    (_sketch.varints)
    posting_keys                    Postings.names: a text's posting list keys
                                    (_sketch.posting_keys)
    join_postings                   Postings.join's append to the posting lists
                                    (_sketch.join_postings)
    rank_postings                   Postings.lookup's count of the lists' entries
                                    (_sketch.count_postings)
    leave_entries                   Buckets.leave and Postings.leave: an article's entries out
                                    (_sketch.leave_entries)
    posting_entries                 a posting list's entries as integers
"""

from __future__ import annotations

import collections
import itertools
import struct
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from neardup.core.anchors import Anchors
from neardup.state.tables import FEW_ANCHORS, POSTING, POSTING_ENTRY, POSTING_SEQS, SEQ

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


def posting_keys(anchors: Anchors) -> list[bytes]:
    """The reference of the compiled _sketch.posting_keys: the packed hashes are the keys' suffixes."""
    raw = anchors.packed[: 4 * len(anchors)]
    return list(dict.fromkeys([POSTING + raw[at : at + 4] for at in range(0, len(raw), 4)]))


def join_postings(
    names: Sequence[bytes], found: Sequence[bytes | None], entry: bytes, full: int, into: dict[bytes, Any]
) -> tuple[int, int]:
    """`entry` appended to the posting lists `found` (None: absent) into `into` by their names,
    but to those of `full` bytes or more; returns how many lists it starts and how many it
    fills: the reference of the compiled _sketch.join_postings."""
    created = filled = 0
    for name, stored in zip(names, found, strict=True):
        if stored is None:
            created += 1
            into[name] = entry
        elif len(stored) < full:
            joined = stored + entry
            filled += len(joined) >= full
            into[name] = joined
    return created, filled


def rank_postings(
    found: Sequence[bytes | None], width: int, full: int, need: int, top: int
) -> list[tuple[int, int]]:
    """The entries of the posting lists `found` (None: absent; `full` bytes or more: boilerplate,
    left out) counted at least `need` times or flagged (an article of fewer than two anchors), as
    (seq, count), the most counted first, then the earliest, at most `top`: the reference of the
    compiled _sketch.count_postings."""
    if width != POSTING_ENTRY:
        raise ValueError(f"posting entries are {POSTING_ENTRY} bytes, not {width}")
    held = b"".join([stored for stored in found if stored and len(stored) < full])
    if not held:
        return []
    counts = collections.Counter(posting_entries(held).tolist())
    ranked = sorted(
        (-count, entry & POSTING_SEQS)
        for entry, count in counts.items()
        if count >= need or entry & FEW_ANCHORS
    )
    return [(seq, -count) for count, seq in ranked[:top]]


def pack_changes(changes: dict[bytes, bytes | None]) -> bytes:
    """The reference of _sketch.pack_changes: the count, each key's length (a byte), each value's
    (4 bytes, 0xFFFFFFFF for a deletion), the keys, the values."""
    keys, values = list(changes), list(changes.values())
    lengths = [0xFFFFFFFF if value is None else len(value) for value in values]
    head = struct.pack(f">I{len(keys)}B{len(keys)}I", len(keys), *map(len, keys), *lengths)
    return b"".join((head, *keys, *[value for value in values if value is not None]))


def unpack_changes(data: bytes) -> list[tuple[bytes, bytes | None]]:
    """The entries pack_changes packed, in order (what _sketch.apply_changes sets in a dict)."""
    (count,) = struct.unpack_from(">I", data)
    key_lengths = struct.unpack_from(f">{count}B", data, 4)
    value_lengths = struct.unpack_from(f">{count}I", data, 4 + count)
    key_ends = list(itertools.accumulate(key_lengths, initial=4 + 5 * count))
    at, entries = key_ends[-1], []
    for start, end, length in zip(key_ends, key_ends[1:], value_lengths, strict=False):
        entries.append((data[start:end], None if length == 0xFFFFFFFF else data[at : at + length]))
        at += 0 if length == 0xFFFFFFFF else length
    assert at == len(data), "every byte read"
    return entries


def join_buckets(
    names: Sequence[bytes],
    found: Sequence[bytes | None],
    entry: bytes,
    limit: int,
    into: dict[bytes, Any],
    sizes: list[int],
) -> int:
    """`entry` appended to the buckets `found` (None: absent), each cut to its last `limit` bytes,
    into `into` by their names, the histogram `sizes` (buckets by member count) moved along;
    returns how many buckets it starts: the reference of the compiled _sketch.join_buckets."""
    created = 0
    for name, stored in zip(names, found, strict=True):
        before = len(stored or b"") // len(entry)
        joined = ((stored or b"") + entry)[-limit:]
        after = len(joined) // len(entry)
        sizes.extend([0] * (after + 1 - len(sizes)))
        if before:
            sizes[before] -= 1
        sizes[after] += 1
        created += before == 0
        into[name] = joined
    return created


def posting_entries(stored: bytes) -> npt.NDArray[np.uint64]:
    """The entries of posting lists joined back to back (POSTING_ENTRY bytes each), as integers."""
    rows = np.frombuffer(stored, dtype=np.uint8).reshape(-1, POSTING_ENTRY)
    wide = np.zeros((rows.shape[0], SEQ.size), dtype=np.uint8)
    wide[:, SEQ.size - POSTING_ENTRY :] = rows
    return wide.view(np.dtype(">u8")).ravel().astype(np.uint64)


def leave_entries(
    names: Sequence[bytes],
    found: Sequence[bytes | None],
    entry: bytes,
    masked: bool,
    full: int,
    into: dict[bytes, Any],
    sizes: list[int] | None,
) -> tuple[int, int, list[bytes]]:
    """Every entry equal to `entry` (`masked`: but for its first byte's top bit) out of the values
    `found`, the rest (None: nothing left) into `into` by their names, the histogram `sizes`
    moved along; returns how many it empties, how many of those it changes held `full` bytes or
    more, and the names it changes: the reference of the compiled _sketch.leave_entries."""
    width, mask = len(entry), 0x7F if masked else 0xFF
    emptied, unfilled, changed = 0, 0, []
    for name, stored in zip(names, found, strict=True):
        entries = [(stored or b"")[at : at + width] for at in range(0, len(stored or b""), width)]
        kept = [e for e in entries if (e[0] & mask, e[1:]) != (entry[0] & mask, entry[1:])]
        if len(kept) == len(entries):
            continue
        emptied += not kept
        unfilled += bool(full) and len(stored or b"") >= full
        into[name] = b"".join(kept) or None
        changed.append(name)
        if sizes is not None:
            sizes.extend([0] * (len(entries) + 1 - len(sizes)))
            sizes[len(entries)] -= 1
            if kept:
                sizes[len(kept)] += 1
    return emptied, unfilled, changed
