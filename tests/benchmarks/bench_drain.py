"""What a write of a held state costs while its entries go back to being keys (state/held.py).

Fills a held state on RocksDB (write-ahead log on, as the worker's) with `--entries` band-bucket
entries of random keys, `--changes` a write, then lowers HELD_ENTRIES below them: from there each
write moves DRAIN_STEP entries to keys beside its own changes, until none is held. Prints the wall
time of a write while held, while draining and once keyed (median and p99 over each phase), how
many writes the draining took, and the longest single write, which is the pause a decision waits
for at most. `--step` past `--entries` moves them all in one write, as the state did before it
drained a step at a time: the baseline.

Usage:
  python tests/benchmarks/bench_drain.py [--entries 2000000] [--changes 1000] [--step 4096]
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from neardup.state import held  # noqa: E402
from neardup.state.port import Batch  # noqa: E402
from neardup.state.rocks import HELD, RocksKV, RocksOptions  # noqa: E402
from neardup.state.tables import BAND  # noqa: E402


def main() -> None:
    layout = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=layout)
    parser.add_argument("--entries", type=int, default=2_000_000)
    parser.add_argument("--step", type=int, default=held.DRAIN_STEP, help="past --entries: in one pause")
    parser.add_argument("--changes", type=int, default=1000, help="entries a write adds")
    args = parser.parse_args()
    rng = random.Random(0)

    def batch() -> Batch:
        return Batch(main={BAND + rng.randbytes(9): rng.randbytes(8) for _ in range(args.changes)})

    with tempfile.TemporaryDirectory() as work:
        rocks = RocksKV(Path(work) / "state", RocksOptions())
        state = held.HeldFamilies(rocks, HELD)
        phases: dict[str, list[float]] = {"held": [], "draining": [], "keyed": []}
        while len(state.held) < args.entries:
            phase = phases["held"]
            started = time.perf_counter()
            state.write(batch())
            phase.append(time.perf_counter() - started)
        held.HELD_ENTRIES, held.DRAIN_STEP = args.changes, args.step
        for phase_name in ("draining", "keyed"):
            for _ in range(len(phases["draining"]) if phase_name == "keyed" else 10**9):
                if phase_name == "draining" and not state.prefixes:
                    break
                started = time.perf_counter()
                state.write(batch())
                phases[phase_name].append(time.perf_counter() - started)
        state.close()
    for name, times in phases.items():
        ms = sorted(time * 1e3 for time in times)
        p99 = ms[int(len(ms) * 0.99)]
        middle = statistics.median(ms)
        print(f"{name:9s} writes {len(ms):6d}  median {middle:7.2f} ms  p99 {p99:7.2f}  max {ms[-1]:7.2f}")
    drained = len(phases["draining"])
    print(f"DRAIN_STEP {held.DRAIN_STEP}: {args.entries:,} entries drained in {drained} writes")


if __name__ == "__main__":
    main()
