"""What a key costs in the index's RocksDB, and how many keys an article reads and writes: the floor
under any decision code, compiled or not.

Four measurements, alternated `--repeats` times, CPU time of this process (RocksDB's background
flushes and compactions included, they run in its threads):

  * a read: multi-gets of the same random keys (30% present) in calls of 1, 28 (one article's band
    keys and posting lists), 560 (a worker chunk of 20 articles) and 5,600 keys, µs per key;
  * a write: write batches of 20 articles' keys (`--keys` each, values of 100 and 300 bytes, plus
    a 1.2 KB record per article in the records family), µs per key written;
  * a write beside Python: write batches as above in one thread while another runs a Python loop,
    wall time against each alone: whether RocksDB's writes could leave the deciding thread (they
    could only where rocksdict lets the GIL go while RocksDB writes);
  * the keys per article, by family (the one-byte prefixes of state/index.py), that the engine
    reads and writes deciding `--articles` articles of bench_stream.py's generator, or of `--input`
    (the news corpus), in the worker's chunks of 20, with the containment index off and on.

The floor an article costs is then its keys read times a read plus its keys written times a write.

Usage:
  python tests/benchmarks/bench_store_keys.py [--repeats 3] [--articles 3000 | --input FILE]
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from neardup.state.port import Batch  # noqa: E402
from neardup.state.rocks import RocksKV, RocksOptions  # noqa: E402
from tests.benchmarks.bench_index_floor import Call, decide_all  # noqa: E402
from tests.benchmarks.bench_state_size import write_input  # noqa: E402
from tests.support.state import flush  # noqa: E402

CALL_SIZES = (1, 28, 560, 5600)
ARTICLES_A_BATCH = 20


def read_costs(work: Path, rng: random.Random) -> dict[int, float]:
    """µs per key of multi-gets of the same keys, by the number of keys a call."""
    kv = RocksKV(work / f"read-{rng.random()}", RocksOptions())
    stored = [rng.randbytes(12) for _ in range(200_000)]
    for at in range(0, len(stored), 5_000):
        batch = Batch()
        batch.main.update({key: b"x" * 64 for key in stored[at : at + 5_000]})
        kv.write(batch)
    probe = [rng.choice(stored) if rng.random() < 0.3 else rng.randbytes(12) for _ in range(28_000)]
    costs = {}
    for size in CALL_SIZES:
        started = time.process_time()
        for at in range(0, len(probe), size):
            kv.get_many(probe[at : at + size])
        costs[size] = (time.process_time() - started) / len(probe) * 1e6
    kv.close()
    return costs


def article_batches(
    rng: random.Random, keys: int, value_bytes: int, batches: int, record_bytes: int = 0
) -> list[Batch]:
    """`batches` write batches of ARTICLES_A_BATCH articles of `keys` keys each (drawn from a pool
    of 60,000, so that some are rewritten) with values of `value_bytes`; with `record_bytes`, a
    record of that size per article in the records family."""
    pool = [rng.randbytes(12) for _ in range(60_000)]
    per_batch = keys * ARTICLES_A_BATCH
    made = []
    for _ in range(batches):
        batch = Batch()
        batch.main.update({rng.choice(pool): rng.randbytes(value_bytes) for _ in range(per_batch)})
        if record_bytes:
            records = {rng.randbytes(8): rng.randbytes(record_bytes) for _ in range(ARTICLES_A_BATCH)}
            batch.records.update(records)
        made.append(batch)
    return made


def write_all(kv: RocksKV, batches: list[Batch]) -> None:
    for batch in batches:
        kv.write(batch)


def write_cost(work: Path, rng: random.Random, keys: int, value_bytes: int, batches: int = 200) -> float:
    """µs per key written, in batches of ARTICLES_A_BATCH articles of `keys` keys and one record."""
    kv = RocksKV(work / f"write-{rng.random()}", RocksOptions())
    prepared = article_batches(rng, keys, value_bytes, batches, record_bytes=1_200)
    started = time.process_time()
    write_all(kv, prepared)
    flush(kv)
    spent = time.process_time() - started
    kv.close()
    return spent / sum(len(batch.main) for batch in prepared) * 1e6


def beside_python(
    work: Path, rng: random.Random, keys: int, batches: int = 200
) -> tuple[float, float, float]:
    """Wall seconds of write batches alone (values of 100 bytes, no records), of a Python loop
    alone, and of both at once in two threads: both take their sum where the writes hold the GIL,
    the longer of the two where not."""

    def spin() -> None:
        total = 0
        for n in range(10_000_000):
            total += n

    def timed(*work: Callable[[], None]) -> float:
        threads = [threading.Thread(target=job) for job in work]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - started

    kv = RocksKV(work / f"beside-{rng.random()}", RocksOptions())
    writes = timed(functools.partial(write_all, kv, article_batches(rng, keys, 100, batches)))
    python = timed(spin)
    both = timed(functools.partial(write_all, kv, article_batches(rng, keys, 100, batches)), spin)
    kv.close()
    return writes, python, both


def keys_per_article(calls: list[Call], articles: int) -> tuple[dict[str, float], dict[str, float]]:
    """Keys read and written per article, by family prefix."""
    read: collections.Counter[str] = collections.Counter()
    written: collections.Counter[str] = collections.Counter()
    for kind, argument in calls:
        if kind == "get":
            read.update(key[:1].decode() for key in argument)
        elif kind == "write":
            written.update(key[:1].decode() for key in argument[0])
    return (
        {family: count / articles for family, count in read.most_common()},
        {family: count / articles for family, count in written.most_common()},
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--articles", type=int, default=3_000)
    parser.add_argument("--input", type=Path, help="JSON lines to decide (their first --articles)")
    parser.add_argument("--keys", type=int, default=50, help="keys written per article in the write test")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        reads: dict[int, list[float]] = {size: [] for size in CALL_SIZES}
        writes: dict[int, list[float]] = {100: [], 300: []}
        beside: list[tuple[float, float, float]] = []
        for _ in range(args.repeats):
            for size, cost in read_costs(work, rng).items():
                reads[size].append(cost)
            for value_bytes in writes:
                writes[value_bytes].append(write_cost(work, rng, args.keys, value_bytes))
            beside.append(beside_python(work, rng, args.keys))
        print(f"medians of {args.repeats} runs, CPU µs per key (load {os.getloadavg()[0]:.1f})")
        print(
            "  read, by keys a multi-get: "
            + ", ".join(f"{n}: {statistics.median(reads[n]):.2f}" for n in CALL_SIZES)
        )
        print(
            "  written, by value size:    "
            + ", ".join(f"{n} B: {statistics.median(writes[n]):.2f}" for n in writes)
        )
        writes_alone, python_alone, both = (statistics.median(run[i] for run in beside) for i in range(3))
        print(
            f"  beside Python, wall s: writes {writes_alone:.3f}, a Python loop {python_alone:.3f}, both in "
            f"two threads {both:.3f} ({both / (writes_alone + python_alone):.2f} of their sum; "
            f"{max(writes_alone, python_alone) / (writes_alone + python_alone):.2f} if they overlapped)"
        )
        source = work / "in.jsonl"
        if args.input is None:
            write_input(source, args.articles, args.seed)
        else:
            with args.input.open("rb") as given, source.open("wb") as out:
                for _, line in zip(range(args.articles), given, strict=False):
                    out.write(line)
        articles = sum(1 for _ in source.open("rb"))
        read_cost, write_100 = statistics.median(reads[28]), statistics.median(writes[100])
        for on in (False, True):
            _, calls = decide_all(source, work / f"decide-{on}", on, True, ARTICLES_A_BATCH)
            read, written = keys_per_article(calls, articles)
            total_read, total_written = sum(read.values()), sum(written.values())
            floor = total_read * read_cost + total_written * write_100
            print(f"containment index {'on' if on else 'off'}, {articles} articles:")
            print(
                f"  keys read {total_read:.1f} an article: "
                + ", ".join(f"{f} {n:.1f}" for f, n in read.items())
            )
            print(
                f"  keys written {total_written:.1f}: "
                + ", ".join(f"{f} {n:.1f}" for f, n in written.items())
            )
            print(f"  floor: {floor:.0f} µs an article in the store (reads at 28 a call, writes of 100 B)")


if __name__ == "__main__":
    main()
