"""Byte encoding of indexed articles: one record per article version, the unit of state and changelog."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson

from ..core.dedup import Candidate, Decision, IndexedArticle
from ..core.signing import Fingerprint

_MAGIC = b"N1"
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


def encode_article(article: IndexedArticle) -> bytes:
    """Magic, meta length, orjson meta, then the raw little-endian signature."""
    fp = article.fingerprint
    meta = orjson.dumps(
        {
            "id": article.article_id,
            "version": article.version,
            "seq": article.seq,
            "content_hash": fp.content_hash.hex(),
            "shingles": fp.shingle_count,
            "short": fp.short,
            "decision": decision_to_dict(article.decision),
        }
    )
    signature = np.ascontiguousarray(fp.signature, dtype="<u8").tobytes()
    return _MAGIC + _LEN.pack(len(meta)) + meta + signature


def decode_article(data: bytes, key: str = "?") -> IndexedArticle:
    try:
        if data[:2] != _MAGIC:
            raise ValueError(f"unknown record format {data[:2]!r}")
        (meta_len,) = _LEN.unpack_from(data, 2)
        meta = orjson.loads(data[6 : 6 + meta_len])
        signature = np.frombuffer(data[6 + meta_len :], dtype="<u8").astype(np.uint64)
        fp = Fingerprint(bytes.fromhex(meta["content_hash"]), signature, meta["shingles"], meta["short"])
        return IndexedArticle(
            meta["id"], meta["version"], meta["seq"], fp, decision_from_dict(meta["decision"])
        )
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise CorruptRecord(f"state record {key!r} cannot be decoded: {exc}") from exc
