"""The Python writers of what an indexed article leaves behind, which the compiled ones
(service/core/_decide.c, in _sketch) replace in the product; the tests compare them byte for byte:

    encode_record       state/records.py's encode_record (_sketch.encode_record)
    verdict_json        orjson.dumps(messages.verdict_dict(...)) (_sketch.verdict_json)
"""

from __future__ import annotations

import numpy as np
import orjson

from neardup.core.anchors import NO_ANCHORS
from neardup.core.dedup import Decision, IndexedArticle
from neardup.core.params import DedupParams
from neardup.messages import verdict_dict
from neardup.state.records import (
    _BAND_INDEX,
    _CANONICAL_CLUSTER,
    _CANONICAL_SELF,
    _DECISION,
    _EXACT,
    _KINDS,
    _MATCH_APART,
    _OWN_CLUSTER,
    _SCORES,
    _SHORT,
    MAGIC,
)


def _varints(values: tuple[int, ...]) -> bytes:
    """Unsigned LEB128, one after the other: seven bits a byte, the low ones first."""
    out = bytearray()
    for value in values:
        while value > 0x7F:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out)


def _zigzag(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


def _pack_id(text: str) -> bytes:
    data = text.encode()
    return _varints((len(data),)) + data


def _compact_decision(decision: Decision, article_id: str, cluster_id: str) -> bytes:
    candidates = decision.candidates
    match = decision.match_id
    # the match's place among the candidates, when one has its id and scores (255: none has)
    scored = [(c.article_id, c.jaccard, c.containment, c.contains) for c in candidates]
    chosen = (match, decision.jaccard, decision.containment, decision.contains)
    where = scored.index(chosen) if chosen in scored else 255
    flags = _EXACT if decision.exact else 0
    if decision.canonical_id == article_id:
        flags |= _CANONICAL_SELF
    elif decision.canonical_id == cluster_id:
        flags |= _CANONICAL_CLUSTER
    if match is not None and where == 255:
        flags |= _MATCH_APART
    parts = [_DECISION.pack(_KINDS.index(decision.kind), flags, where, len(candidates))]
    if flags & _MATCH_APART:
        assert match is not None and decision.jaccard is not None
        parts += (_pack_id(match), _SCORES.pack(decision.jaccard, decision.containment, decision.contains))
    if not flags & (_CANONICAL_SELF | _CANONICAL_CLUSTER):
        parts.append(_pack_id(decision.canonical_id))
    for c in candidates:
        parts += (_pack_id(c.article_id), _SCORES.pack(c.jaccard, c.containment, c.contains))
    if decision.passages:
        values = [len(decision.passages)]
        for p in decision.passages:
            values += (p.start, p.end, p.other_start, p.other_end, p.anchors)
        parts.append(_varints(tuple(values)))
    return b"".join(parts)


def encode_record(article: IndexedArticle) -> bytes:
    """Head, ids, verifier, band keys, content hash, decision, anchors (and the signature without
    verifier)."""
    sketch = article.sketch
    own = article.cluster_id == article.article_id
    article_id, cluster_id = article.article_id.encode(), b"" if own else article.cluster_id.encode()
    verifier = np.ascontiguousarray(sketch.verifier, dtype=np.uint8).tobytes()
    # band_keys() gives them in band order, each led by its index: the decoder puts it back
    keys = b"".join([key[_BAND_INDEX.size :] for key in article.keys])
    decision = _compact_decision(article.decision, article.article_id, article.cluster_id)
    signature = b"" if verifier else np.ascontiguousarray(sketch.signature, dtype="<u8").tobytes()
    # a duplicate keeps no anchors: it joins no posting list, and its match holds the same text
    anchors = sketch.anchors if article.in_postings else NO_ANCHORS
    flags = (_SHORT if sketch.short else 0) | (_OWN_CLUSTER if own else 0)
    numbers = (article.seq, article.version, _zigzag(article.time_ms), _zigzag(article.seq - article.cluster))
    lengths = map(len, (article_id, cluster_id, sketch.content_hash, verifier, keys, decision))
    head = _varints((*numbers, sketch.shingle_count, flags, *lengths, len(anchors)))
    body = (article_id, cluster_id, verifier, keys, sketch.content_hash, decision, anchors.packed, signature)
    return MAGIC + head + b"".join(body)


def verdict_json(article: IndexedArticle, params: DedupParams, latency_ms: float | None) -> bytes:
    """The verdict as published, written by orjson from its dict."""
    return orjson.dumps(verdict_dict(article, params, latency_ms))
