"""Byte encoding of indexed articles: one record per article version, the unit of state and changelog."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson

from ..core.dedup import Candidate, Decision, IndexedArticle
from ..core.minhash import narrow_verifier
from ..core.signing import Fingerprint

_MAGIC = b"N3"  # 8-bit verifier slots
# Formats written before, by the bytes of their verifier slots (narrowed to 8 bits when read).
_VERIFIER_BYTES = {_MAGIC: 1, b"N2": 2, b"N1": 4}
_LEN = struct.Struct(">I")


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


def pack_sketches(fp: Fingerprint) -> bytes:
    """Signature (little-endian uint64) then verifier (one byte a slot), back to back."""
    signature = np.ascontiguousarray(fp.signature, dtype="<u8").tobytes()
    return signature + np.ascontiguousarray(fp.verifier, dtype=np.uint8).tobytes()


def unpack_sketches(data: bytes, slots: int, verifier_bytes: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of pack_sketches, given the number of signature slots. `verifier_bytes` > 1: the
    verifier was written with wider slots (earlier formats); it comes back narrowed to 8 bits."""
    signature = np.frombuffer(data, dtype="<u8", count=slots).astype(np.uint64)
    if verifier_bytes == 1:
        return signature, np.frombuffer(data, dtype=np.uint8, offset=slots * 8).copy()
    stored = np.frombuffer(data, dtype=f"<u{verifier_bytes}", offset=slots * 8)
    return signature, narrow_verifier(stored, int(np.iinfo(stored.dtype).max))


def encode_article(article: IndexedArticle) -> bytes:
    """Magic, meta length, orjson meta, then the raw sketches."""
    fp = article.fingerprint
    meta = orjson.dumps(
        {
            "id": article.article_id,
            "version": article.version,
            "seq": article.seq,
            "content_hash": fp.content_hash.hex(),
            "shingles": fp.shingle_count,
            "short": fp.short,
            "slots": fp.signature.size,
            "decision": decision_to_dict(article.decision),
        }
    )
    return _MAGIC + _LEN.pack(len(meta)) + meta + pack_sketches(fp)


def decode_article(data: bytes, key: str = "?") -> IndexedArticle:
    try:
        verifier_bytes = _VERIFIER_BYTES.get(data[:2])
        if verifier_bytes is None:
            raise ValueError(f"unknown record format {data[:2]!r}")
        (meta_len,) = _LEN.unpack_from(data, 2)
        meta = orjson.loads(data[6 : 6 + meta_len])
        signature, verifier = unpack_sketches(data[6 + meta_len :], meta["slots"], verifier_bytes)
        fp = Fingerprint(
            bytes.fromhex(meta["content_hash"]), signature, meta["shingles"], meta["short"], verifier
        )
        return IndexedArticle(
            meta["id"], meta["version"], meta["seq"], fp, decision_from_dict(meta["decision"])
        )
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise CorruptRecord(f"state record {key!r} cannot be decoded: {exc}") from exc
