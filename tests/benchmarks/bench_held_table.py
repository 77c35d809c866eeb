"""The held table's growth (_sketch.HeldTable, state/held.py): the longest apply while it fills.

Fills an empty table with `--entries` band-bucket entries of random keys, `--changes` an apply (as
the held families apply a write's changes), and times each apply: its median, p99 and max are the
pause a write takes in the table alone, the max the one an apply that makes the table grow waits
for. Also the whole fill's time and the process's peak resident memory. This checkout's interpreter
and `--baseline`'s (another checkout's venv) take turns, `--repeats` times each, in processes of
their own; the medians of each figure are compared.

Usage:
  python tests/benchmarks/bench_held_table.py --baseline ../previous/.venv/bin/python
      [--entries 8000000] [--changes 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

# What one run does, in the interpreter it is given (this build's or the baseline's).
ONE_RUN = """
import json, random, resource, statistics, sys, time
from neardup.core.compiled import _sketch

entries, changes = int(sys.argv[1]), int(sys.argv[2])
rng = random.Random(0)
table, times = _sketch.HeldTable(), []
started = time.perf_counter()
for _ in range(entries // changes):
    packed = _sketch.pack_changes({b"b" + rng.randbytes(9): rng.randbytes(8) for _ in range(changes)})
    at = time.perf_counter()
    table.apply(packed)
    times.append(time.perf_counter() - at)
total = time.perf_counter() - started
times.sort()
print(json.dumps({
    "median": statistics.median(times) * 1e3,
    "p99": times[int(len(times) * 0.99)] * 1e3,
    "max": times[-1] * 1e3,
    "total": total,
    "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "held": len(table),
}))
"""

FIGURES = (
    ("median", "ms an apply"),
    ("p99", "ms"),
    ("max", "ms"),
    ("total", "s the fill"),
    ("rss", "MB peak"),
)


def one_run(python: str, entries: int, changes: int) -> dict[str, float]:
    argv = [python, "-c", ONE_RUN, str(entries), str(changes)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", required=True, help="another checkout's venv python")
    parser.add_argument("--entries", type=int, default=8_000_000)
    parser.add_argument("--changes", type=int, default=1000, help="entries an apply adds")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
    for repeat in range(args.repeats):
        for name, python in (("baseline", args.baseline), ("this", sys.executable)):
            figures = one_run(python, args.entries, args.changes)
            runs[name].append(figures)
            shown = ", ".join(f"{key} {figures[key]:.2f}" for key, _ in FIGURES)
            print(f"  run {repeat + 1} {name:8} {shown}", flush=True)
    print(f"{args.entries} entries, {args.changes} an apply, medians of {args.repeats}:")
    for key, unit in FIGURES:
        this = statistics.median(run[key] for run in runs["this"])
        baseline = statistics.median(run[key] for run in runs["baseline"])
        print(f"  {key:6} this {this:9.2f}, baseline {baseline:9.2f} {unit}: {this / baseline:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
