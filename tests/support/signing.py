"""Signed records as the sign stage makes them, and arrivals that exercise every path of the index."""

from __future__ import annotations

import itertools
from typing import Any

import orjson

from neardup.core.params import DedupParams
from neardup.pipeline.sign import SignResult, SignStage
from neardup.pipeline.signer import Signer, SignItem
from neardup.pipeline.wire import Provenance, Signed, decode_signed
from tests.support.prose import PROSE

PARAMS = DedupParams()
SRC = Provenance("neardup-articles", 2, 4711, 1_717_000_000_000)


def article(article_id: Any, text: Any, **extra: Any) -> bytes:
    return orjson.dumps({"id": article_id, "text": text, **extra})


INPUT_OFFSETS = itertools.count()  # the input partition's next message, shared by every caller


def signed(
    article_id: str, text: str, input_offset: int | None = None, params: DedupParams = PARAMS
) -> Signed:
    """Signed as the sign stage would, by default from the next message of its input partition."""
    offset = next(INPUT_OFFSETS) if input_offset is None else input_offset
    src = Provenance(SRC.topic, SRC.partition, offset, SRC.timestamp_ms)
    result = SignStage(params, 1_000_000).handle(article(article_id, text), article_id.encode(), src)
    assert result.signed is not None, result.reason
    item = decode_signed(result.signed)
    assert isinstance(item, Signed)
    return item


# Arrivals that exercise every path: unique, near-duplicate, exact copy, partial, a new version of an
# article (its old content still held by an exact copy), a version that returns to an earlier text.
HEAD = PROSE[1][: len(PROSE[1]) * 6 // 10]
HISTORY = [
    ("a", PROSE[0]),
    ("b", PROSE[0] + " Reporting by the wire desk."),
    ("c", PROSE[1]),
    ("d", PROSE[0]),
    ("a", PROSE[2]),
    ("e", HEAD),
    ("f", PROSE[3]),
]
FUTURE = [
    ("g", PROSE[0]),
    ("h", PROSE[1] + " Copyright 2024."),
    ("a", PROSE[0]),
    ("i", PROSE[2]),
    ("j", PROSE[0][: len(PROSE[0]) * 6 // 10]),
    ("f", PROSE[4]),
    ("k", PROSE[3]),
]


def helper_pids(signer: Signer) -> list[int]:
    """The process ids of a signer's live helpers."""
    return [helper.pid for helper in signer._helpers]


def signed_here(signer: Signer, items: list[SignItem]) -> list[SignResult]:
    """What the signer's stage makes of `items` in this process, for comparison with its helpers."""
    return [signer.stage.handle(raw, key, src) for raw, key, src in items]
