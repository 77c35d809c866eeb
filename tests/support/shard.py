"""One article signed and decided on a shard, as the library does it."""

from __future__ import annotations

import dataclasses

from neardup.core.dedup import IndexedArticle
from neardup.core.retention import Retention
from neardup.messages import Article
from neardup.pipeline.shard import IndexShard
from neardup.pipeline.sign import SignStage
from neardup.pipeline.wire import Provenance


def process(
    shard: IndexShard,
    article_id: str,
    text: str,
    published_at: str | None = None,
    *,
    now_ms: int | None = None,
) -> IndexedArticle:
    """Sign one article and decide it on `shard`, as the library does, and return it as indexed;
    raises what signing raises (signing.EmptyText for an empty text)."""
    stage = SignStage(shard.params, 1 << 30, Retention(skew_ms=shard.retention.skew_ms))
    signed = stage.sign(Article(article_id, text, published_at=published_at), CALLER, now_ms)
    decided = shard.decide([signed], now=None if now_ms is None else now_ms / 1000)[0]
    assert decided.error is None, decided.error
    indexed = shard.state.get(article_id)
    assert indexed is not None
    # as decided, with its whole sketch: the stored record keeps no signature (its band keys and
    # verifier serve instead) and a duplicate's keeps no anchors
    return dataclasses.replace(indexed, sketch=signed.sketch) if decided.status == "new" else indexed


CALLER = Provenance("test", None, 0, None)
