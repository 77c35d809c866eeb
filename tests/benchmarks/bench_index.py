"""Index-stage benchmark, in process (no broker): the cost of one article as the index grows.

The stream worker's event loop spends most of its time in the index stage once the index holds tens
of thousands of articles. This script signs N articles once (the generator of bench_stream.py: new
articles recombine corpus paragraphs, 30% are near-copies of recent ones), then runs the index stage
(decide, apply to the derived RocksDB index, write the record) over a fresh state for each
configuration, each in a process of its own, and prints the main-thread CPU time per article per
block of articles and the memory the configuration grew by (peak resident set over the run):

  baseline   no probe cache: every candidate's probe read from RocksDB (and a record cache of
             100,000 decoded records, the default before candidates were read as probes)
  current    the defaults: probe cache of 100,000 (NEARDUP_PROBE_CACHE), record cache of 20,000
  memtable   as current, with a 32 MB memtable for the small keys (the default before 8 MB)

and, after the current run, the time of a full garbage collection with everything the run left alive,
without and with the worker's collector policy (gc.freeze of the survivors, service/stream/collector.py).

Usage: python tests/benchmarks/bench_index.py [--articles 50000] [--block 5000] [--seed 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
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

from service.core.params import DedupParams  # noqa: E402
from service.state.rocks import RocksOptions, RocksState  # noqa: E402
from service.stream.stages import IndexStage, Provenance, Signed, SignStage, decode_signed  # noqa: E402

CURRENT = RocksOptions(write_ahead_log=False)
CONFIGURATIONS = {
    "baseline": dataclasses.replace(CURRENT, probe_cache=0, record_cache=100_000),
    "current": CURRENT,
    # the memtable of the small keys as it was: 32 MB instead of 8
    "memtable": dataclasses.replace(CURRENT, write_buffer_mb=32),
}


def signed_articles(count: int, seed: int) -> list[Signed]:
    corpus = load_corpus(CORPUS if CORPUS.exists() else SAMPLE)
    articles = Articles(corpus, "bench", seed, dup_fraction=0.3)
    stage = SignStage(DedupParams(), 1_000_000)
    out = []
    for offset in range(count):
        key, value = articles.next()
        result = stage.handle(value, key, Provenance("articles", 0, offset, 1_700_000_000_000))
        assert result.signed is not None, result.reason
        out.append(decode_signed(result.signed))
    return out


def run(
    items: list[Signed], options: RocksOptions, block: int, state_dir: Path
) -> tuple[list[float], IndexStage]:
    """µs of main-thread CPU per article, per block (RocksDB's own threads are not counted)."""
    stage = IndexStage(DedupParams(), RocksState(state_dir, options), {})
    stage.open()
    per_block: list[float] = []
    started = time.thread_time()
    for offset, item in enumerate(items):
        stage.handle(item, offset)
        stage.applied(offset)
        if offset % 100 == 99:
            stage.checkpoint()
        if (offset + 1) % block == 0:
            now = time.thread_time()
            per_block.append((now - started) / block * 1e6)
            started = now
    return per_block, stage


def resident_kb(field: str) -> int:
    """VmRSS (now) or VmHWM (the peak) of this process, in KB, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(items: list[Signed], name: str, options: RocksOptions, block: int, state_dir: Path) -> dict:
    """One configuration's run, in a child process: its figures only, and its memory growth."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as answer:
            figures = json.loads(answer.read() or b"{}")
        os.waitpid(pid, 0)
        if not figures:
            raise RuntimeError(f"configuration {name} failed; see its output above")
        return figures
    os.close(read_end)
    try:
        before = resident_kb("VmRSS")
        per_block, stage = run(items, options, block, state_dir)
        figures: dict = {"per_block": per_block, "grown_mb": (resident_kb("VmHWM") - before) / 1024}
        if name == "current":
            gc.unfreeze()
            figures["plain_gc_ms"] = full_collection_ms()
            gc.collect(1)
            gc.freeze()
            figures["frozen_gc_ms"] = full_collection_ms()
            gc.unfreeze()
        stage.close()
        with os.fdopen(write_end, "wb") as out:
            out.write(json.dumps(figures).encode())
    finally:
        os._exit(0)


def full_collection_ms(repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--articles", type=int, default=50_000)
    parser.add_argument("--block", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    print(f"signing {args.articles:,} articles ...", flush=True)
    items = signed_articles(args.articles, args.seed)
    results: dict[str, list[float]] = {}
    grown: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="neardup-bench-index-") as tmp:
        for name, options in CONFIGURATIONS.items():
            figures = measure(items, name, options, args.block, Path(tmp) / name)
            results[name] = per_block = figures["per_block"]
            grown[name] = figures["grown_mb"]
            print(
                f"  {name:9} probe cache {options.probe_cache:>7,}, record cache {options.record_cache:>7,}, "
                f"memtable {options.write_buffer_mb} MB: memory +{grown[name]:.0f} MB; "
                f"µs/article per {args.block:,} articles:"
            )
            print("    " + " ".join(f"{value:.0f}" for value in per_block), flush=True)
            if name == "current":
                plain, frozen = figures["plain_gc_ms"], figures["frozen_gc_ms"]

    base, cur, big = results["baseline"], results["current"], results["memtable"]
    tail = max(1, len(cur) // 5)  # the last fifth of the run: the largest index
    base_tail, cur_tail = statistics.median(base[-tail:]), statistics.median(cur[-tail:])
    big_tail = statistics.median(big[-tail:])
    print(f"\nsummary: {args.articles:,} articles, index stage in process, main-thread CPU time")
    print(f"  first block            baseline {base[0]:.0f} µs/article, current {cur[0]:.0f} µs/article")
    print(
        f"  last {tail} block(s)        baseline {base_tail:.0f} µs/article, "
        f"current {cur_tail:.0f} µs/article"
    )
    print(f"  current / baseline     {cur_tail / base_tail:.2f} at the largest index")
    print(
        f"  current / memtable     {cur_tail / big_tail:.2f} at the largest index "
        f"({cur_tail:.0f} against {big_tail:.0f} µs/article with the 32 MB memtable)"
    )
    print(f"  growth, last / first   baseline {base_tail / base[0]:.2f}x, current {cur_tail / cur[0]:.2f}x")
    print(
        f"  memory grown by        baseline {grown['baseline']:.0f} MB, current {grown['current']:.0f} MB, "
        f"memtable {grown['memtable']:.0f} MB (peak resident set of each run's process)"
    )
    print(
        f"  full gc.collect()      {plain:.1f} ms with the run's objects live; "
        f"{frozen:.1f} ms after gc.freeze()"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
