"""A hot story beside ordinary news: the index's cost per article must not grow with a cluster.

Signs, ahead of timing, N near-identical copies of one story (each with 1-3 words replaced and a
byline of its own; one in ten exact) and N ordinary articles (bench_stream.py's generator: new
articles recombining corpus paragraphs, 30% near-copies of recent ones). Then indexes each stream
into a fresh RocksDB state through the engine (decide, apply, as `neardup dedup --state` does, signing
excluded: it costs the same for every article and runs in parallel in the worker), and prints the
articles/s of every block. Optionally (--uncapped N) the hot story again with buckets that keep every
member, the layout before buckets were capped: what the cap buys.

Targets: the hot story's last block within 1.5x of its first, and within 2x of the ordinary
stream's rate (its median block).

With --retention-days D, the ordinary stream once more under a retention window of D days, the
articles a minute apart in event time: once the window is full, every article expires one, and the
rate beside the run without retention is expiry's cost.

Usage: python tests/benchmarks/bench_hot_story.py [--articles 100000] [--block 10000] [--uncapped 20000]
                                                  [--retention-days 7] [--no-containment-index]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "tests" / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_stream import CORPUS, SAMPLE, Articles, load_corpus  # noqa: E402

from neardup.core.lsh import band_keys  # noqa: E402
from neardup.core.params import DedupParams  # noqa: E402
from neardup.core.retention import NO_RETENTION, Retention  # noqa: E402
from neardup.core.signing import Sketch, sketch_of  # noqa: E402
from neardup.pipeline import wire  # noqa: E402
from neardup.pipeline.shard import IndexShard  # noqa: E402
from neardup.state.rocks import RocksOptions, RocksState  # noqa: E402

PARAMS = DedupParams()
MINUTE_MS = 60_000
Signed = tuple[str, Sketch, tuple[bytes, ...]]


def hot_story(count: int, seed: int) -> list[str]:
    corpus = load_corpus(CORPUS if CORPUS.exists() else SAMPLE)
    rng = random.Random(seed)
    story = max((r["text"] for r in corpus[:200]), key=len)[:3000]
    vocabulary = sorted({w for w in story.split() if w.isalpha()})
    texts = []
    for i in range(count):
        if rng.random() < 0.1:
            texts.append(story)
            continue
        words = story.split(" ")
        for _ in range(rng.randint(1, 3)):
            words[rng.randrange(len(words))] = rng.choice(vocabulary)
        texts.append(" ".join(words) + f"\n\nReporting by desk {i % 97}.")
    return texts


def ordinary(count: int, seed: int) -> list[str]:
    import orjson

    corpus = load_corpus(CORPUS if CORPUS.exists() else SAMPLE)
    articles = Articles(corpus, "news", seed, dup_fraction=0.3)
    return [orjson.loads(articles.next()[1])["text"] for _ in range(count)]


def sign(texts: list[str], prefix: str) -> list[Signed]:
    signed = []
    for i, text in enumerate(texts):
        sketch = sketch_of(text, PARAMS)
        signed.append(
            (
                f"{prefix}-{i:07d}",
                sketch,
                tuple(band_keys(sketch.signature, PARAMS.lsh.bands, PARAMS.lsh.rows)),
            )
        )
    return signed


def run(
    name: str, signed: list[Signed], block: int, options: RocksOptions, retention: Retention = NO_RETENTION
) -> list[float]:
    """Articles/s per block of `block`, indexing into a fresh state; the articles are a minute
    apart in event time."""
    rates = []
    with tempfile.TemporaryDirectory(prefix="neardup-hot-") as directory:
        state = RocksState(Path(directory) / "state", options)
        shard = IndexShard(state, PARAMS, retention)
        banding = (PARAMS.lsh.bands, PARAMS.lsh.rows)
        kinds: dict[str, int] = {}
        try:
            for start in range(0, len(signed), block):
                chunk = signed[start : start + block]
                began = time.perf_counter()
                for n, (article_id, sketch, keys) in enumerate(chunk, start):
                    src = wire.Provenance("bench", None, n, None)
                    item = wire.Signed.of(article_id, sketch, src, keys, banding, n * MINUTE_MS)
                    [decided] = shard.decide([item])
                    assert decided.kind is not None, decided.error
                    kind = decided.kind
                    kinds[kind] = kinds.get(kind, 0) + 1
                rates.append(len(chunk) / (time.perf_counter() - began))
                print(f"  {name:<9} block {start // block + 1:>3}: {rates[-1]:>8,.0f} articles/s", flush=True)
            stats = state.stats()
        finally:
            state.close()
    print(
        f"  {name:<9} verdicts {kinds}; largest bucket {stats.largest_bucket}, buckets {stats.buckets:,}, "
        f"held {stats.articles:,}, expired {stats.expired:,}"
    )
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--articles", type=int, default=100_000, help="of each stream")
    parser.add_argument("--block", type=int, default=10_000)
    parser.add_argument("--uncapped", type=int, default=0, help="hot copies indexed with uncapped buckets")
    parser.add_argument(
        "--retention-days",
        type=float,
        default=0,
        help="also the ordinary stream under this retention window (articles a minute apart): expiry's cost",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-containment-index", action="store_true", help="with the containment index off (on by default)"
    )
    args = parser.parse_args()
    if args.no_containment_index:
        global PARAMS
        PARAMS = DedupParams(containment_index=False)

    began = time.perf_counter()
    hot = sign(hot_story(args.articles, args.seed), "hot")
    news = sign(ordinary(args.articles, args.seed), "news")
    print(f"signed {2 * args.articles:,} articles in {time.perf_counter() - began:.0f} s (not timed below)")

    options = RocksOptions()
    news_rates = run("ordinary", news, args.block, options)
    hot_rates = run("hot", hot, args.block, options)
    news_median = statistics.median(news_rates)
    first, last = hot_rates[0], hot_rates[-1]
    print()
    print(f"ordinary news, median block: {news_median:,.0f} articles/s")
    print(f"hot story: first block {first:,.0f}, last block {last:,.0f} articles/s")
    flat, near = first / last, news_median / last
    print(f"  first/last {flat:.2f}x (target <= 1.5x): {'PASS' if flat <= 1.5 else 'FAIL'}")
    print(f"  ordinary/last {near:.2f}x (target <= 2x): {'PASS' if near <= 2 else 'FAIL'}")
    if args.retention_days:
        print()
        window = Retention(window_ms=round(args.retention_days * 1440 * MINUTE_MS))
        expiring = run("expiring", news, args.block, options, window)
        steady = expiring[-len(expiring) // 2 :]
        print(
            f"ordinary news under a {args.retention_days:g}-day window (~1 article expired per article once "
            f"full): median block of the second half {statistics.median(steady):,.0f} articles/s, "
            f"{statistics.median(steady) / news_median:.2f}x the rate without retention"
        )
    if args.uncapped:
        print()
        uncapped = run("uncapped", hot[: args.uncapped], args.block, RocksOptions(bucket_cap=10**9))
        print(f"uncapped buckets: first block {uncapped[0]:,.0f}, last {uncapped[-1]:,.0f} articles/s")
        print(f"  first/last {uncapped[0] / uncapped[-1]:.2f}x")


if __name__ == "__main__":
    main()
