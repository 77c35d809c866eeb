"""Rebuild benchmark: the decider child re-derives its index from a changelog of N articles.

A worker whose index was lost (a crash, a new machine) rebuilds it from the record table's changelog
at assignment. This script fills a changelog (a list standing in for the Kafka topic) by running the
index stage over N signed articles (the generator of bench_stream.py), then starts a decider child
(service/pipeline/decider.py) on an empty directory and times its rebuild, and prints the child's peak
resident memory (VmHWM) beside that of a child, started in the same run, that rebuilt one article,
and the size of the table's records: the rebuild streams the changelog in chunks and compacts it on
disk, so its peak should not grow with the table.
It then checks that the rebuilt index decides the next articles exactly as the index that built the
table does.

Usage: python tests/benchmarks/bench_rebuild.py [--articles 50000] [--check 1000] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for path in (ROOT, ROOT / "tests" / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from bench_index import signed_articles  # noqa: E402

from neardup.core.params import DedupParams  # noqa: E402
from neardup.pipeline.decider import Decider  # noqa: E402
from neardup.pipeline.shard import ARTICLE_PREFIX, IndexShard, SizeGauge, decide_messages  # noqa: E402
from neardup.pipeline.wire import encode_signed, pack_signed  # noqa: E402
from neardup.state.rocks import RocksOptions, RocksState  # noqa: E402
from tests.support.changelog import ListChangelog, compacted  # noqa: E402
from tests.support.decider import answer, child_pid  # noqa: E402


def memory_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


async def main(args: argparse.Namespace) -> None:
    params = DedupParams()
    items = signed_articles(args.articles + args.check, args.seed)
    built, later = items[: args.articles], items[args.articles :]
    workdir = Path(tempfile.mkdtemp(prefix="neardup-rebuild-"))
    options = RocksOptions(write_ahead_log=False, record_cache=100_000)
    writes: list[tuple[bytes, bytes | None]] = []
    source = IndexShard(RocksState(workdir / "source", options), params, changelog=writes)
    source.replay({})
    for offset, item in enumerate(built):
        source.decide([item], offset)
    source.checkpoint()
    table = compacted(writes)
    record_bytes = sum(len(v) for k, v in table.items() if k.startswith(ARTICLE_PREFIX))
    print(f"record table: {args.articles:,} articles, {record_bytes / 2**20:,.0f} MB of records", flush=True)

    # the baseline, in the same run: a child that rebuilds a table of one article
    one = [next((k, v) for k, v in table.items() if k.startswith(ARTICLE_PREFIX))]
    small = Decider(params, workdir / "small", options, ListChangelog(one), in_process=False)
    assert await small.open() == 1 and child_pid(small) is not None
    baseline_mb = memory_kb(child_pid(small), "VmHWM") / 1024
    await small.close(clean=False)

    changelog = ListChangelog(list(table.items()))
    decider = Decider(params, workdir / "rebuilt", options, changelog, in_process=False)
    started = time.perf_counter()
    count = await decider.open()
    seconds = time.perf_counter() - started
    pid = child_pid(decider)
    assert pid is not None and count == args.articles, count
    peak_mb = memory_kb(pid, "VmHWM") / 1024
    print(f"rebuild: {seconds:.1f} s ({count / seconds:,.0f} articles/s)")
    print(
        f"decider child, peak resident: {peak_mb:,.0f} MB after this rebuild, {baseline_mb:,.0f} MB after "
        f"rebuilding one article ({peak_mb / baseline_mb:.2f}x); the table's records: "
        f"{record_bytes / 2**20:,.0f} MB"
    )

    messages = [(args.articles + n, pack_signed([encode_signed(item)])) for n, item in enumerate(later)]
    expected = decide_messages(source, messages, SizeGauge())
    got, _ = await answer(decider, messages)
    same = [(e.article_id, e.kind, e.status) for e in got.entries] == [
        (e.article_id, e.kind, e.status) for e in expected.entries
    ]
    print(f"next {len(later):,} articles decided as by the index that built the table: {same}")
    await decider.close(clean=False)
    source.state.close()
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--articles", type=int, default=50_000)
    parser.add_argument("--check", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=1)
    asyncio.run(main(parser.parse_args()))
