"""One article signed and decided on a shard, as the library does it."""

from __future__ import annotations

from neardup.core.dedup import IndexedArticle
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
    """Sign one article and decide it on `shard`, as the library does; raises what either raises
    (signing.EmptyText for an empty text)."""
    stage = SignStage(shard.params, 1 << 30, shard.retention.skew_ms)
    signed = stage.sign(Article(article_id, text, published_at=published_at), CALLER, now_ms)
    decided = shard.decide([signed], now=None if now_ms is None else now_ms / 1000)[0]
    if decided.error is not None:
        raise decided.error
    assert decided.article is not None
    return decided.article


CALLER = Provenance("test", None, 0, None)
