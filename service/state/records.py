"""Byte encoding of indexed articles: one record per article version, the unit of state and changelog.

A record holds what deciding and rebuilding need, and nothing else: what scoring the article as a
candidate reads (distinct shingle count, ids, its cluster, the 8-bit verifier) first, so that a
probe is read from the front of the record without decoding the rest; then the band keys it was
indexed under (so it can be taken out of its buckets without its signature), its content hash, and
the decision that re-delivery repeats. The 128-slot signature is kept only where there is no
verifier (NEARDUP_VERIFY_PERM=0): band keys and verifier together are what the signature served.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from ..core.dedup import Candidate, Decision, IndexedArticle
from ..core.lsh import BAND_KEY_BYTES
from ..core.signing import Fingerprint

MAGIC = b"N4"
# seq, version, time (ms), cluster seq, distinct shingles, flags, then the byte lengths of: id,
# cluster id, content hash, verifier, band keys, decision
_HEAD = struct.Struct(">QIqQIBHHBHHH")
_SHORT = 1  # flag: the text was shorter than k
_NO_SIGNATURE = np.empty(0, dtype=np.uint64)


class CorruptRecord(ValueError):
    """A stored record could not be decoded; its key is named so it can be inspected."""


def decision_to_dict(decision: Decision) -> dict[str, Any]:
    return {
        "kind": decision.kind,
        "match_id": decision.match_id,
        "jaccard": decision.jaccard,
        "containment": decision.containment,
        "contains": decision.contains,
        "canonical_id": decision.canonical_id,
        "exact": decision.exact,
        "candidates": [[c.article_id, c.jaccard, c.containment, c.contains] for c in decision.candidates],
    }


def decision_from_dict(data: dict[str, Any]) -> Decision:
    return Decision(
        kind=data["kind"],
        match_id=data["match_id"],
        jaccard=data["jaccard"],
        containment=data["containment"],
        contains=data["contains"],
        canonical_id=data["canonical_id"],
        exact=data["exact"],
        candidates=tuple(Candidate(c[0], c[1], c[2], c[3]) for c in data["candidates"]),
    )


def _compact_decision(decision: Decision) -> bytes:
    """The decision as a short JSON array (its keys would double its size)."""
    return orjson.dumps(
        [
            decision.kind,
            decision.match_id,
            decision.jaccard,
            decision.containment,
            decision.contains,
            decision.canonical_id,
            decision.exact,
            [[c.article_id, c.jaccard, c.containment, c.contains] for c in decision.candidates],
        ]
    )


def _decision_of(data: bytes) -> Decision:
    kind, match_id, jaccard, containment, contains, canonical, exact, candidates = orjson.loads(data)
    return Decision(
        kind,
        match_id,
        jaccard,
        containment,
        contains,
        canonical,
        exact,
        tuple(Candidate(c[0], c[1], c[2], c[3]) for c in candidates),
    )


def encode_article(article: IndexedArticle) -> bytes:
    """Head, ids, verifier, band keys, content hash, decision (and the signature without verifier)."""
    fp = article.fingerprint
    article_id, cluster_id = article.article_id.encode(), article.cluster_id.encode()
    verifier = np.ascontiguousarray(fp.verifier, dtype=np.uint8).tobytes()
    keys = b"".join(article.keys)
    decision = _compact_decision(article.decision)
    signature = b"" if verifier else np.ascontiguousarray(fp.signature, dtype="<u8").tobytes()
    head = _HEAD.pack(
        article.seq,
        article.version,
        article.time_ms,
        article.cluster,
        fp.shingle_count,
        _SHORT if fp.short else 0,
        len(article_id),
        len(cluster_id),
        len(fp.content_hash),
        len(verifier),
        len(keys),
        len(decision),
    )
    return b"".join(
        (MAGIC, head, article_id, cluster_id, verifier, keys, fp.content_hash, decision, signature)
    )


@dataclass(slots=True, eq=False)
class Probe:
    """A candidate as verification reads it (a Prospect): the front of its record. Its full
    article (fingerprint, decision) is decoded only when asked."""

    article_id: str
    seq: int
    shingle_count: int
    verifier: bytes
    cluster: int
    cluster_id: str
    time_ms: int
    record: bytes

    @property
    def canonical_id(self) -> str:
        return self.article.decision.canonical_id

    @property
    def fingerprint(self) -> Fingerprint:
        return self.article.fingerprint

    @property
    def article(self) -> IndexedArticle:
        return decode_article(self.record)


def decode_probe(data: bytes, key: str = "?") -> Probe:
    """The front of a record: what scoring it as a candidate reads."""
    try:
        if data[:2] != MAGIC:
            raise ValueError(f"unknown record format {data[:2]!r}")
        seq, _, time_ms, cluster, count, _, id_len, cluster_len, _, verifier_len, _, _ = _HEAD.unpack_from(
            data, 2
        )
        start = 2 + _HEAD.size
        middle = start + id_len
        end = middle + cluster_len
        article_id, cluster_id = data[start:middle].decode(), data[middle:end].decode()
    except (ValueError, struct.error) as exc:
        raise CorruptRecord(f"state record {key!r} cannot be decoded: {exc}") from exc
    return Probe(article_id, seq, count, data[end : end + verifier_len], cluster, cluster_id, time_ms, data)


def decode_article(data: bytes, key: str = "?") -> IndexedArticle:
    try:
        if data[:2] != MAGIC:
            raise ValueError(f"unknown record format {data[:2]!r}")
        (
            seq,
            version,
            time_ms,
            cluster,
            count,
            flags,
            id_len,
            cluster_len,
            hash_len,
            verifier_len,
            keys_len,
            decision_len,
        ) = _HEAD.unpack_from(data, 2)
        position = 2 + _HEAD.size
        parts = []
        for length in (id_len, cluster_len, verifier_len, keys_len, hash_len, decision_len):
            parts.append(data[position : position + length])
            position += length
        article_id, cluster_id, verifier, keys, content_hash, decision = parts
        if len(decision) != decision_len or keys_len % BAND_KEY_BYTES:
            raise ValueError("record is truncated")
        signature = (
            np.frombuffer(data, dtype="<u8", offset=position).astype(np.uint64) if not verifier else None
        )
        fp = Fingerprint(
            content_hash,
            _NO_SIGNATURE if signature is None else signature,
            count,
            bool(flags & _SHORT),
            np.frombuffer(verifier, dtype=np.uint8).copy(),
        )
        band_keys = tuple(keys[i : i + BAND_KEY_BYTES] for i in range(0, keys_len, BAND_KEY_BYTES))
        return IndexedArticle(
            article_id.decode(),
            version,
            seq,
            fp,
            _decision_of(decision),
            band_keys,
            time_ms,
            cluster,
            cluster_id.decode(),
        )
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise CorruptRecord(f"state record {key!r} cannot be decoded: {exc}") from exc


def pack_sketches(fp: Fingerprint) -> bytes:
    """Signature (little-endian uint64) then verifier (one byte a slot), back to back: how the
    signatures topic carries a fingerprint."""
    signature = np.ascontiguousarray(fp.signature, dtype="<u8").tobytes()
    return signature + np.ascontiguousarray(fp.verifier, dtype=np.uint8).tobytes()


def unpack_sketches(data: bytes, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of pack_sketches, given the number of signature slots."""
    signature = np.frombuffer(data, dtype="<u8", count=slots).astype(np.uint64)
    return signature, np.frombuffer(data, dtype=np.uint8, offset=slots * 8).copy()
