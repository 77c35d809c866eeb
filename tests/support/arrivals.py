"""Arrivals to decide: real paragraphs mixed into a stream of new texts, near and exact copies,
excerpts, new versions, deletions and ids added again, signed as the worker signs them."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson

from neardup.core.params import DedupParams
from neardup.pipeline.shard import Decided, IndexShard, Item
from neardup.pipeline.sign import SignStage
from neardup.pipeline.wire import Provenance, decode_signed

SAMPLE = Path(__file__).resolve().parents[2] / "service" / "data" / "sample_news.jsonl"
NOW_S = 1_800_000_000.0  # the clock the tests decide at


def paragraphs() -> list[str]:
    texts = [orjson.loads(line)["text"] for line in SAMPLE.read_bytes().splitlines() if line.strip()]
    return [p for text in texts for p in text.split("\n\n") if len(p) >= 80]


def stream(seed: int, count: int) -> Iterator[tuple[str, str | None]]:
    """(id, text or None for a deletion): new texts, near copies, exact copies, excerpts, new
    versions of an id, deletions (of held and unknown ids) and ids added again, a copy often
    right after its source, where a batch decides both."""
    rng, pool = random.Random(seed), paragraphs()
    held: list[tuple[str, str]] = []
    for n in range(count):
        roll = rng.random()
        if not held or roll < 0.35:
            text = "\n\n".join(rng.sample(pool, rng.randint(1, 4)))
            held.append((f"n{n}", text))
            yield held[-1]
            continue
        source_id, source = held[-1] if rng.random() < 0.5 else rng.choice(held)
        if roll < 0.55:
            words = source.split()
            for _ in range(rng.randint(1, 3)):
                words[rng.randrange(len(words))] = rng.choice(words)
            held.append((f"c{n}", " ".join(words)))
        elif roll < 0.65:
            held.append((f"x{n}", source))
        elif roll < 0.75:
            start = rng.randrange(max(len(source) // 3, 1))
            held.append((f"p{n}", source[start : start + max(len(source) // 2, 300)]))
        elif roll < 0.85:
            held.append((source_id, source + " " + rng.choice(pool)))
        elif roll < 0.93:
            yield (source_id if rng.random() < 0.8 else f"gone{n}"), None
            continue
        else:
            held.append((source_id, rng.choice(pool)))  # an id deleted or not, added again
        yield held[-1]


def signed_items(arrivals: Sequence[tuple[str, str | None]], params: DedupParams) -> list[Item]:
    stage = SignStage(params, 1_000_000)
    items: list[Item] = []
    for n, (article_id, text) in enumerate(arrivals):
        src = Provenance("articles", 0, n, 1_700_000_000_000 + n * 1000)
        raw = None if text is None else orjson.dumps({"id": article_id, "text": text})
        result = stage.handle(raw, article_id.encode(), src)
        assert result.signed is not None, result.reason
        items.append(decode_signed(result.signed))
    return items


def sample_news() -> list[tuple[str, str | None]]:
    """The bundled sample news as (id, text)."""
    news = [orjson.loads(line) for line in SAMPLE.read_bytes().splitlines() if line.strip()]
    return [(article["id"], article["text"]) for article in news]


def in_batches(shard: IndexShard, items: list[Item], size: int, layered: bool = False) -> list[Decided]:
    """As the worker's decider: batches numbered by their first item (held, then committed, under
    the write overlay with `layered`)."""
    results: list[Decided] = []
    for chunk, at in enumerate(range(0, len(items), size)):
        if layered:
            shard.begin(chunk)
        results += shard.decide(items[at : at + size], offset=at, now=NOW_S)
        if layered:
            shard.commit(chunk, at + size)
    return results
