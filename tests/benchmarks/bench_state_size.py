"""Local state per article in embedded mode, by key family.

Writes `--articles` articles of bench_stream.py's generator to a JSON-lines file, runs
`neardup dedup --state` over it (which compacts the state at close), then reports the bytes under
the state directory per article (`du -sb`), each column family's table files, and per key family
(the main family's one-byte prefixes, see service/state/index.py) the sum of key and value sizes
read back; for the records, their parts.

Usage:
  python tests/benchmarks/bench_state_size.py [--articles 20000] [--seed 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from neardup.state.records import _head  # noqa: E402
from neardup.state.rocks import RocksKV, RocksOptions  # noqa: E402
from tests.benchmarks.bench_stream import CORPUS, SAMPLE, Articles, load_corpus  # noqa: E402
from tests.support.state import family_property  # noqa: E402

RECORD_PARTS = ("id", "cluster id", "content hash", "verifier", "band digests", "decision", "anchors")


def write_input(path: Path, count: int, seed: int) -> None:
    articles = Articles(load_corpus(CORPUS if CORPUS.exists() else SAMPLE), "bench", seed, 0.3)
    with path.open("wb") as out:
        for _ in range(count):
            out.write(articles.next()[1] + b"\n")


def report(state: Path, count: int) -> None:
    kv = RocksKV(state, RocksOptions(), read_only=True)
    try:
        sizes: collections.Counter[str] = collections.Counter()
        keys: collections.Counter[str] = collections.Counter()
        for key, value in kv.scan(b""):
            sizes[chr(key[0])] += len(key) + len(value)
            keys[chr(key[0])] += 1
        parts: collections.Counter[str] = collections.Counter()
        for key, value in kv.scan_records():
            parts["key and value"] += len(key) + len(value)
            fields, start = _head(value)
            parts["magic and head"] += start
            for part, length in zip(RECORD_PARTS, (*fields[6:12], 5 * fields[12]), strict=True):
                parts[part] += length
        on_disk = kv.size_bytes()
        print(f"state {state}: {on_disk / count:,.1f} bytes per article ({on_disk:,} bytes)")
        for name, tables in family_property(kv, "rocksdb.total-sst-files-size").items():
            print(f"  table files of {name}: {tables / count:,.1f} per article")
        print("main family, key and value bytes per article (keys per article):")
        for prefix in sorted(sizes):
            print(f"  {prefix}: {sizes[prefix] / count:7.1f}  ({keys[prefix] / count:.2f})")
        print("records, bytes per article:")
        for part, total in parts.items():
            print(f"  {part}: {total / count:.1f}")
    finally:
        kv.close()


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--articles", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="leave the input, verdicts and state here")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="neardup-state-size-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        source, state = work / "articles.jsonl", work / "state"
        write_input(source, args.articles, args.seed)
        shutil.rmtree(state, ignore_errors=True)
        command = [sys.executable, "-m", "neardup", "dedup", str(source), "-o", str(work / "verdicts.jsonl")]
        subprocess.run([*command, "--state", str(state), "-q"], check=True)
        report(state, args.articles)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
