"""Byte encoding of indexed articles: one record per article version, the unit of state and changelog.

A record holds what deciding and rebuilding need, and nothing else: what scoring the article as a
candidate reads (distinct shingle count, ids, its cluster, the 8-bit verifier) first, so that a
probe is read from the front of the record without decoding the rest; then the band keys it was
indexed under (so it can be taken out of its buckets without its signature), its content hash, and
the decision that re-delivery repeats, and the anchors (core/anchors.py: Anchors.packed, 32-bit
hashes, then each one's offset from the one before in one byte, a winnowing gap never being
wider). The 128-slot signature is kept only where there is no verifier (NEARDUP_VERIFY_PERM=0):
band keys and verifier together are what the signature served.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..core.anchors import ANCHOR_BYTES, Anchors, Passage
from ..core.compiled import _sketch
from ..core.dedup import Candidate, Decision, IndexedArticle, VerdictKind
from ..core.lsh import BAND_KEY_BYTES
from ..core.signing import Sketch
from ..errors import Error

MAGIC = b"N7"
# The head: unsigned LEB128 varints (most of its numbers are small) of seq, version, time (ms,
# zigzag: it may be negative), seq minus cluster seq (zigzag: 0 for a cluster's own first article),
# distinct shingles, flags, then the byte lengths of: id, cluster id (0 with _OWN_CLUSTER), content
# hash, verifier, band digests, decision; and the number of anchors.
_HEAD_FIELDS = 13
_SHORT = 1  # flag: the text was shorter than k
_OWN_CLUSTER = 2  # flag: the cluster id is the article's own (not stored twice)
NO_SIGNATURE = np.empty(0, dtype=np.uint64)  # of a record with a verifier: none kept
# A band key is the band's index then its digest: the index is the key's position, so only the
# digests are stored.
_BAND_INDEX = struct.Struct(">H")
_DIGEST = BAND_KEY_BYTES - _BAND_INDEX.size
# The decision, in binary: kind, flags, the match's place among the candidates, the candidates
# (id, Jaccard, containment, contains: 8-byte floats, so that a replayed verdict is identical);
# the match and the canonical id only where the rest does not give them; then the shared passages,
# if any: their count and five varints each (core/anchors.py: Passage).
_KINDS: tuple[VerdictKind, ...] = ("unique", "duplicate", "partial", "revised")
_DECISION = struct.Struct(">BBBB")  # kind, flags, match index, candidates
_EXACT, _CANONICAL_SELF, _CANONICAL_CLUSTER, _MATCH_APART = 1, 2, 4, 8
_SCORES = struct.Struct(">ddd")


class CorruptRecord(Error, ValueError):
    """A stored record could not be decoded; its key is named so it can be inspected."""


def _unzigzag(value: int) -> int:
    return value >> 1 if not value & 1 else -(value >> 1) - 1


def _unpack_id(data: bytes, position: int) -> tuple[str, int]:
    size, start = data[position], position + 1
    if size > 0x7F:  # an id of 128 bytes or more
        (size,), start = _sketch.varints(data, position, 1)
    if start + size > len(data):
        raise ValueError("decision is truncated")
    return data[start : start + size].decode(), start + size


def _head(data: bytes) -> tuple[tuple[int, ...], int]:
    """The head's fields and where the ids start."""
    if data[:2] != MAGIC:
        raise ValueError(f"unknown record format {data[:2]!r}")
    return _sketch.varints(data, len(MAGIC), _HEAD_FIELDS)


def _decision_of(data: bytes, article_id: str, cluster_id: str) -> Decision:
    kind, flags, where, count = _DECISION.unpack_from(data)
    position = _DECISION.size
    match: tuple[str | None, float | None, float | None, float | None] = (None, None, None, None)
    if flags & _MATCH_APART:
        match_id, position = _unpack_id(data, position)
        match = (match_id, *_SCORES.unpack_from(data, position))
        position += _SCORES.size
    canonical = article_id if flags & _CANONICAL_SELF else cluster_id
    if not flags & (_CANONICAL_SELF | _CANONICAL_CLUSTER):
        canonical, position = _unpack_id(data, position)
    candidates = []
    for _ in range(count):
        candidate_id, position = _unpack_id(data, position)
        candidates.append(Candidate(candidate_id, *_SCORES.unpack_from(data, position)))
        position += _SCORES.size
    passages: tuple[Passage, ...] = ()
    if position < len(data):
        (many,), position = _sketch.varints(data, position, 1)
        values, position = _sketch.varints(data, position, 5 * many)
        passages = tuple(Passage(*values[i : i + 5]) for i in range(0, len(values), 5))
    if position != len(data):
        raise ValueError(f"decision has {len(data) - position} bytes too many or few")
    if match[0] is None and where != 255:
        chosen = candidates[where]
        match = (chosen.article_id, chosen.jaccard, chosen.containment, chosen.contains)
    return Decision(_KINDS[kind], *match, canonical, bool(flags & _EXACT), tuple(candidates), passages)


def encode_record(article: IndexedArticle) -> bytes:
    """Head, ids, verifier, band keys, content hash, decision, anchors (and the signature without
    verifier), in one compiled pass (_sketch.encode_record; its Python reference is
    tests/support/reference_records.py)."""
    return _sketch.encode_record(article)


@dataclass(slots=True, eq=False)
class Probe:
    """A candidate as verification reads it (a Prospect): the front of its record. Its full
    article (sketch, decision) is decoded only when asked."""

    article_id: str
    seq: int
    shingle_count: int
    verifier: bytes  # what scoring compares: the verifier, or the signature where there is none
    cluster: int
    cluster_id: str
    time_ms: int
    record: bytes
    anchors_at: int = 0  # where the record's anchors start
    anchor_count: int = 0

    @property
    def anchors(self) -> Anchors:
        """The anchors, decoded from the record when asked (a candidate found by its bands
        needs none unless it is the match)."""
        return Anchors.unpack_from(self.record, self.anchor_count, self.anchors_at)

    @property
    def sketch(self) -> Sketch:
        return self.article.sketch

    @property
    def article(self) -> IndexedArticle:
        return decode_record(self.record)


def decode_probe(data: bytes, key: str = "?") -> Probe:
    """The front of a record: what scoring it as a candidate reads."""
    try:
        fields, start = _head(data)
        seq, _, time, cluster, count, flags, id_len, cluster_len, hash_len, verifier_len = fields[:10]
        keys_len, decision_len, n_anchors = fields[10:]
        middle = start + id_len
        end = middle + cluster_len
        if end + verifier_len > len(data):
            raise ValueError("record is truncated")
        article_id = data[start:middle].decode()
        cluster_id = article_id if flags & _OWN_CLUSTER else data[middle:end].decode()
    except (ValueError, IndexError) as exc:
        raise CorruptRecord(f"state record {key!r} cannot be decoded: {exc}") from exc
    cluster_seq, time_ms = seq - _unzigzag(cluster), _unzigzag(time)
    anchors_at = end + verifier_len + keys_len + hash_len + decision_len
    # without a verifier, scoring compares the signature (little-endian, after the anchors)
    signature_at = anchors_at + ANCHOR_BYTES * n_anchors
    verifier = data[end : end + verifier_len] if verifier_len else data[signature_at:]
    return Probe(
        article_id, seq, count, verifier, cluster_seq, cluster_id, time_ms, data, anchors_at, n_anchors
    )


def decode_record(data: bytes, key: str = "?") -> IndexedArticle:
    """A stored record → its article version (encode_record's inverse); CorruptRecord names `key`."""
    try:
        fields, position = _head(data)
        seq, version, time, cluster, count, flags = fields[:6]
        id_len, cluster_len, hash_len, verifier_len, keys_len, decision_len, anchor_count = fields[6:]
        parts = []
        for length in (id_len, cluster_len, verifier_len, keys_len, hash_len, decision_len):
            parts.append(data[position : position + length])
            position += length
        article_id, cluster_id, verifier, keys, content_hash, decision = parts
        if len(decision) != decision_len or keys_len % _DIGEST:
            raise ValueError("record is truncated")
        anchors = Anchors.unpack_from(data, anchor_count, position)
        position += len(anchors.packed)
        signature = NO_SIGNATURE if verifier else np.frombuffer(data[position:], "<u8").astype(np.uint64)
        slots = np.frombuffer(verifier, dtype=np.uint8).copy()
        sketch = Sketch(content_hash, signature, count, bool(flags & _SHORT), slots, anchors)
        band_keys = tuple(
            _BAND_INDEX.pack(band) + keys[start : start + _DIGEST]
            for band, start in enumerate(range(0, keys_len, _DIGEST))
        )
        own_id = article_id.decode()
        cluster_text = own_id if flags & _OWN_CLUSTER else cluster_id.decode()
        decided, cluster_seq = _decision_of(decision, own_id, cluster_text), seq - _unzigzag(cluster)
        return IndexedArticle(
            own_id, version, seq, sketch, decided, band_keys, _unzigzag(time), cluster_seq, cluster_text
        )
    except (ValueError, KeyError, TypeError, IndexError, OverflowError, struct.error) as exc:
        raise CorruptRecord(f"state record {key!r} cannot be decoded: {exc}") from exc
