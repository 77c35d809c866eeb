"""The signatures topic's wire format: what the sign stage writes and the index stage reads.

A signed record (sketch, band keys, event time and provenance, never the text), a deletion in
its place in the input's order, a record wrapped with its input message for the filtered feed, and
many of them packed into one message. Separate from the stages because both share it, and so do
the agents in app.py (packing a sign batch) and the decider process (counting records).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np
import orjson

from ..core.anchors import ANCHOR_BYTES, MAX_ANCHORS, NO_ANCHORS, Anchors
from ..core.compiled import _sketch
from ..core.lsh import BAND_KEY_BYTES
from ..core.params import DedupParams
from ..core.signing import Sketch
from ..messages import MAX_ID_LENGTH

_SIGNED = b"S6"  # band keys, 8-bit verifier, event time, anchors
_SIGNED_BEFORE = b"S5"  # the same without anchors, as the version before wrote them
_DELETE = b"SD"  # a deletion: id and provenance
_PACKED = b"SP"
_FEED = b"SF"  # a signed record wrapped with its input message, for the filtered feed
Headers = tuple[tuple[str, bytes], ...]
_LEN = struct.Struct(">I")
_BANDING = struct.Struct(">HH")  # (bands, rows) of the band keys that follow (0, 0: none)
PACK_MAX_BYTES = 4 * 1024 * 1024  # the signatures topic accepts 8 MB messages (topics.py)
T = TypeVar("T")


class Provenance(NamedTuple):
    """Where an article came from, for dead letters, latency, audit and replay safety."""

    topic: str
    partition: int | None  # None: not a topic's partition (embedded mode's input file)
    offset: int
    timestamp_ms: int | None


class Signed(NamedTuple):
    """What travels on the signatures topic: one article's sketch, no text, its LSH band keys
    (computed in the sign stage, which scales with the input's partitions, rather than in the index
    stage, one process per shard; empty: not computed) and its event time. Flat, its sketch's
    fields as the wire holds them (the signature as little-endian bytes, the anchors packed), the
    first eight in the order of the compiled run's row (state/index.py's FreshRow): the compiled
    decoder (_sketch.signed_record) makes one without running Python code, and the run reads its
    fields as they are. `sketch` gives them as numpy arrays where those are wanted."""

    article_id: str
    content_hash: bytes
    band_keys: tuple[bytes, ...]
    verifier: bytes
    signature: bytes
    shingle_count: int
    short: bool
    anchors: bytes
    provenance: Provenance
    banding: tuple[int, int] = (0, 0)  # the (bands, rows) that gave band_keys
    time_ms: int = 0
    refused_time: bool = False  # its published_at was present but not used

    @classmethod
    def of(cls, article_id: str, sketch: Sketch, provenance: Provenance, band_keys: Sequence[bytes] = (),
           banding: tuple[int, int] = (0, 0), time_ms: int = 0, refused_time: bool = False,
           ) -> Signed:  # fmt: skip
        """An article's signed record from its sketch as signing gives it."""
        signature = np.ascontiguousarray(sketch.signature, dtype="<u8").tobytes()
        verifier = np.ascontiguousarray(sketch.verifier, dtype=np.uint8).tobytes()
        head = (article_id, sketch.content_hash, tuple(band_keys), verifier, signature, sketch.shingle_count)
        return cls(*head, sketch.short, sketch.anchors.packed, provenance, banding, time_ms, refused_time)

    @property
    def sketch(self) -> Sketch:
        """The sketch as numpy arrays over the record's bytes (copied only on a big-endian host)."""
        signature = np.frombuffer(self.signature, dtype="<u8").astype(np.uint64, copy=False)
        verifier = np.frombuffer(self.verifier, dtype=np.uint8)
        anchors = Anchors(self.anchors) if self.anchors else NO_ANCHORS
        return Sketch(self.content_hash, signature, self.shingle_count, self.short, verifier, anchors)

    def band_keys_for(self, bands: int, rows: int) -> tuple[bytes, ...] | None:
        """The band keys when they were computed for this banding, else None (compute them)."""
        return self.band_keys if self.banding == (bands, rows) and self.band_keys else None


class SignedDeletion(NamedTuple):
    """A deletion on the signatures topic, in its place in the input's order."""

    article_id: str
    provenance: Provenance


def encode_signed(signed: Signed) -> bytes:
    """S6, meta length, orjson meta, (bands, rows) and the band keys back to back, the anchors
    (packed: as many as meta's "a"), then the sketches: the signature (little-endian uint64) then
    the verifier (one byte a slot)."""
    src = signed.provenance
    bands, rows = signed.banding if signed.band_keys else (0, 0)
    if len(signed.band_keys) != bands or any(len(key) != BAND_KEY_BYTES for key in signed.band_keys):
        raise ValueError(f"band keys must be one per band of {signed.banding}, {BAND_KEY_BYTES} bytes each")
    meta = orjson.dumps(
        {
            "id": signed.article_id,
            "h": signed.content_hash.hex(),
            "n": signed.shingle_count,
            "s": signed.short,
            "m": len(signed.signature) // 8,
            "src": [src.topic, src.partition, src.offset, src.timestamp_ms],
            "t": signed.time_ms,
            "r": signed.refused_time,
            "a": len(signed.anchors) // ANCHOR_BYTES,
        }
    )
    head = _SIGNED + _LEN.pack(len(meta)) + meta + _BANDING.pack(bands, rows)
    return head + b"".join(signed.band_keys) + signed.anchors + signed.signature + signed.verifier


def with_original(record: bytes, original: bytes, headers: Any = ()) -> bytes:
    """A signed record (encode_signed) wrapped with the input message it came from, so that the
    index stage can forward the message unchanged to the filtered feed (NEARDUP_UNIQUE_TOPIC)
    without reading the input back; a deletion is returned as it is."""
    if record[:2] not in (_SIGNED, _SIGNED_BEFORE):
        return record
    pairs = headers.items() if isinstance(headers, Mapping) else headers  # (name, value) pairs
    head = orjson.dumps([[name, base64.b64encode(value or b"").decode()] for name, value in pairs])
    return _FEED + _LEN.pack(len(original)) + original + _LEN.pack(len(head)) + head + record


# Kafka's longest topic name, and the integer of the most characters in JSON (-2**63).
_TOPIC_MAX_LENGTH = 249
_LONGEST_INT = -(2**63)


def signed_max_bytes(params: DedupParams) -> int:
    """An upper bound on a signed record's size under `params` (a deletion's is smaller):
    encode_signed of one whose id, topic and numbers all take the most room they can."""
    # A control character is escaped as \u00XX: 6 bytes, more than any other character takes.
    worst_id = "\x00" * MAX_ID_LENGTH
    bands, rows = params.lsh.bands, params.lsh.rows
    src = Provenance("t" * _TOPIC_MAX_LENGTH, _LONGEST_INT, _LONGEST_INT, _LONGEST_INT)
    keys = (bytes(BAND_KEY_BYTES),) * bands
    sketches = (bytes(params.verify_perm), bytes(8 * params.num_perm), _LONGEST_INT, False)
    anchors = bytes(ANCHOR_BYTES * MAX_ANCHORS)  # and a 128-bit content hash
    worst = Signed(worst_id, bytes(16), keys, *sketches, anchors, src, (bands, rows), _LONGEST_INT, False)
    return len(encode_signed(worst))


def wrapped_max_bytes(record_max: int, original_max: int, headers_max: int) -> int:
    """An upper bound on with_original's size, for a record, an input message and its headers
    (names and values) of at most these sizes. The headers' JSON takes at most 6 bytes per byte
    of them: an escaped character of a name takes 6, a value in base64 4 per 3, and a header's
    brackets, quotes and comma 8 for the 2 bytes or more it takes in Kafka."""
    return len(_FEED) + _LEN.size + original_max + _LEN.size + 2 + 6 * headers_max + record_max


def encode_deletion(deletion: SignedDeletion) -> bytes:
    src = deletion.provenance
    meta = {"id": deletion.article_id, "src": [src.topic, src.partition, src.offset, src.timestamp_ms]}
    return _DELETE + orjson.dumps(meta)


def decode_signed(data: bytes) -> Signed | SignedDeletion:
    """Inverse of encode_signed and encode_deletion. A signed record as this version writes it,
    and a feed record wrapping one, decode in one compiled call; any other (a deletion, an earlier
    version's, an id or header name with escapes in its JSON, a corrupt one) the compiled decoder
    leaves to `decoded_signed`."""
    return _sketch.signed_record(data, Signed, Provenance) or decoded_signed(data)


def decoded_signed(data: bytes) -> Signed | SignedDeletion:
    """decode_signed in Python: every record it takes, an error for every other. The compiled
    decoder takes what it can from it and must give the same (tests/unit/test_wire.py)."""
    magic = data[:2]
    if magic == _FEED:
        # The input message and its headers are left where they are (feed_inputs reads them),
        # but taken apart all the same: a corrupt feed record is refused here, as a dead letter,
        # not where the feed is published.
        inner = decode_signed(_unwrapped(data)[2])
        if not isinstance(inner, Signed):
            raise ValueError("a feed record must wrap a whole signed record")
        return inner
    if magic == _DELETE:
        meta = orjson.loads(data[2:])
        return SignedDeletion(meta["id"], Provenance(*meta["src"]))
    if magic not in (_SIGNED, _SIGNED_BEFORE):
        raise ValueError(f"not a signed record: {data[:8]!r}")
    (meta_len,) = _LEN.unpack_from(data, 2)
    meta = orjson.loads(data[6 : 6 + meta_len])
    position = 6 + meta_len
    bands, rows = _BANDING.unpack_from(data, position)
    position += _BANDING.size
    if (keys_end := position + bands * BAND_KEY_BYTES) > len(data):
        raise ValueError(f"signed record announces {bands} band keys and is shorter")
    keys = tuple(data[at : at + BAND_KEY_BYTES] for at in range(position, keys_end, BAND_KEY_BYTES))
    position = keys_end
    anchors = Anchors.unpack_from(data, meta.get("a", 0), position).packed
    position += len(anchors)
    signature_end = position + 8 * meta["m"]
    if not position < signature_end <= len(data):
        raise ValueError(f"signed record announces {meta['m']} signature slots: none, or more than it holds")
    signature, verifier = data[position:signature_end], data[signature_end:]
    content_hash, src = bytes.fromhex(meta["h"]), Provenance(*meta["src"])
    return Signed(meta["id"], content_hash, keys, verifier, signature, meta["n"], meta["s"], anchors, src,
                  (bands, rows), meta["t"], meta["r"])  # fmt: skip


def _unwrapped(data: bytes) -> tuple[bytes, Headers, bytes]:
    """A feed record (with_original) taken apart: the input message, its headers and the signed
    record inside, which is left undecoded."""
    (size,) = _LEN.unpack_from(data, 2)
    if len(data) < 6 + size + _LEN.size:
        raise ValueError(f"feed record announces {size} bytes of input message and is shorter")
    (head_size,) = _LEN.unpack_from(data, 6 + size)
    head_at = 6 + size + _LEN.size
    head = orjson.loads(data[head_at : head_at + head_size])
    headers = tuple((name, base64.b64decode(value)) for name, value in head)
    return data[6 : 6 + size], headers, data[head_at + head_size :]


def feed_inputs(data: bytes) -> dict[int, tuple[bytes, Headers]]:
    """The input message and its headers that each feed record of a signatures message wraps, by
    the record's index in the message (unpack_signed). The index stage forwards them to the filtered
    feed from the signatures messages it holds anyway, so that no decision carries them back from
    the decider; the signed records inside are not decoded."""
    return {i: _unwrapped(record)[:2] for i, record in enumerate(unpack_signed(data)) if record[:2] == _FEED}


def pack_signed(records: Sequence[bytes]) -> bytes:
    """Many signed records in one signatures message: the index stage then pays Faust's per-event
    and per-send costs once per sign batch instead of once per article."""
    parts = [_PACKED, _LEN.pack(len(records))]
    for record in records:
        parts += (_LEN.pack(len(record)), record)
    return b"".join(parts)


def pack_in_chunks(records: Sequence[bytes], max_bytes: int = PACK_MAX_BYTES) -> list[bytes]:
    """pack_signed over consecutive runs of `records` of at most `max_bytes` each (≥1 record)."""
    return [pack_signed(run) for run in runs_within(records, lambda r: len(r) + _LEN.size, max_bytes)]


def packed_max_bytes(record_max: int, max_bytes: int = PACK_MAX_BYTES) -> int:
    """An upper bound on a message of pack_in_chunks whose records are at most `record_max` bytes:
    a run within `max_bytes`, or one larger record alone."""
    return len(_PACKED) + _LEN.size + max(max_bytes, _LEN.size + record_max)


def runs_within(items: Sequence[T], size: Callable[[T], int], max_bytes: int) -> list[list[T]]:
    """Consecutive runs of `items` whose sizes add up to at most `max_bytes` (≥1 item per run: an
    item larger than that gets a run of its own)."""
    runs: list[list[T]] = []
    total = 0
    for item in items:
        weight = size(item)
        if not runs or total + weight > max_bytes:
            runs.append([])
            total = 0
        runs[-1].append(item)
        total += weight
    return runs


def signed_count(data: bytes) -> int:
    """How many signed records a signatures message holds, as its header says (at most one per
    4 bytes of it, whatever a corrupt header says)."""
    if data[:2] == _PACKED and len(data) >= 2 + _LEN.size:
        return min(_LEN.unpack_from(data, 2)[0], len(data) // _LEN.size)
    return 1


def unpack_signed(data: bytes) -> list[bytes]:
    """The signed records of one signatures message, packed or single."""
    if data[:2] in (_SIGNED, _SIGNED_BEFORE, _DELETE, _FEED):
        return [data]
    if data[:2] != _PACKED:
        raise ValueError(f"not a signatures message: {data[:8]!r}")
    (count,) = _LEN.unpack_from(data, 2)
    records, position = [], 6
    for _ in range(count):
        (size,) = _LEN.unpack_from(data, position)
        record = data[position + _LEN.size : position + _LEN.size + size]
        if len(record) != size:
            raise ValueError(f"truncated signatures message: {count} records announced")
        records.append(record)
        position += _LEN.size + size
    if position != len(data):
        raise ValueError(f"signatures message has {len(data) - position} trailing bytes")
    return records
