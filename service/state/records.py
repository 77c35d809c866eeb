"""Byte encoding of indexed articles: one record per article version, the unit of state and changelog."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson

from ..core.dedup import Candidate, Decision, IndexedArticle
from ..core.minhash import narrow_verifier
from ..core.signing import Fingerprint

_MAGIC = b"N2"  # 16-bit verifier slots
_MAGIC_WIDE = b"N1"  # as written before: 32-bit verifier slots, narrowed when read
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
    """Signature (little-endian uint64) then verifier (little-endian uint16), back to back."""
    return (
        np.ascontiguousarray(fp.signature, dtype="<u8").tobytes()
        + np.ascontiguousarray(fp.verifier, dtype="<u2").tobytes()
    )


def unpack_sketches(data: bytes, slots: int, *, wide: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of pack_sketches, given the number of signature slots. `wide`: the verifier was
    written with 32-bit slots (formats before 16-bit verifiers); it comes back narrowed to 16."""
    signature = np.frombuffer(data, dtype="<u8", count=slots).astype(np.uint64)
    if wide:
        stored = np.frombuffer(data, dtype="<u4", offset=slots * 8)
        return signature, narrow_verifier(stored, int(np.iinfo(np.uint32).max))
    return signature, np.frombuffer(data, dtype="<u2", offset=slots * 8).astype(np.uint16)


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
        magic = data[:2]
        if magic not in (_MAGIC, _MAGIC_WIDE):
            raise ValueError(f"unknown record format {magic!r}")
        (meta_len,) = _LEN.unpack_from(data, 2)
        meta = orjson.loads(data[6 : 6 + meta_len])
        sketches = data[6 + meta_len :]
        signature, verifier = unpack_sketches(sketches, meta["slots"], wide=magic == _MAGIC_WIDE)
        fp = Fingerprint(
            bytes.fromhex(meta["content_hash"]), signature, meta["shingles"], meta["short"], verifier
        )
        return IndexedArticle(
            meta["id"], meta["version"], meta["seq"], fp, decision_from_dict(meta["decision"])
        )
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise CorruptRecord(f"state record {key!r} cannot be decoded: {exc}") from exc
