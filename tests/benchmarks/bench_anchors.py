"""Anchor schemes compared on the excerpt and revision set (containment_set.py): hash-value
sampling ("mod p") against winnowing (window w), for several shingle lengths k.

Per scheme: anchors per article (per KB), the recall of excerpts (of 15-40% and at least 300
characters; of 200 and 300 characters) under the partial rule (the excerpt shares at least 0.9 of
its anchors, and at least two, or its only one), the share of unrelated pairs with any anchor in
common (false candidates) and flagged by that rule, and the recall of revisions keeping at least
half their source (anchor containment at least each floor of FLOORS either way, two anchors).

Usage:
  python tests/benchmarks/bench_anchors.py [--corpus FILE] [--sources 400] [--unrelated 4000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.benchmarks.containment_set import Pair, build, load_sources  # noqa: E402
from tests.support.reference_anchors import sample_mod, shingle_values, winnow  # noqa: E402

FLOORS = (0.2, 0.3, 0.4, 0.5)
Scheme = Callable[[np.ndarray], np.ndarray]


def anchor_set(text: str, k: int, pick: Scheme) -> set[int]:
    points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    if points.size < k:
        return set()
    values = shingle_values(points, k)
    return set((values[pick(values)] & np.uint64(0xFFFFFFFF)).tolist())


def flagged(mine: set[int], other: set[int], floor: float) -> bool:
    """The excerpt rule: at least `floor` of `mine` in `other`, and two anchors (or all of one)."""
    shared = len(mine & other)
    return bool(mine) and shared >= min(2, len(mine)) and shared >= floor * len(mine)


def evaluate(pairs: list[Pair], k: int, pick: Scheme) -> dict[str, float]:
    counts: dict[str, list[bool]] = {}
    per_kb: list[float] = []

    def note(name: str, value: bool) -> None:
        counts.setdefault(name, []).append(value)

    for pair in pairs:
        a, b = anchor_set(pair.earlier, k, pick), anchor_set(pair.later, k, pick)
        either = flagged(b, a, 0.9) or flagged(a, b, 0.9)
        if pair.kind == "unrelated":
            per_kb.append(1000 * len(a) / len(pair.earlier))
            note("unrelated: an anchor shared", bool(a & b))
            note("unrelated: flagged partial", either)
            for floor in FLOORS:
                note(f"unrelated: flagged revised at {floor}", flagged(b, a, floor) or flagged(a, b, floor))
        elif pair.kind.startswith("excerpt"):
            short = min(len(pair.earlier), len(pair.later))
            share = short / max(len(pair.earlier), len(pair.later))
            if pair.kind in ("excerpt-200", "excerpt-300"):
                note(f"{pair.kind}: flagged partial", either)
            if short >= 300 and share >= 0.15:
                note("excerpt >=15% and >=300 chars: flagged partial", either)
        elif pair.kind == "revision" and pair.kept >= 0.5:
            for floor in FLOORS:
                note(
                    f"revision keeping >=1/2: revised at {floor}",
                    flagged(b, a, floor) or flagged(a, b, floor),
                )
        elif pair.kind == "quoted":
            note("quoted passage: an anchor shared", bool(a & b))
    result = {name: sum(values) / len(values) for name, values in counts.items()}
    result["anchors per KB"] = statistics.mean(per_kb)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--sources", type=int, default=400)
    parser.add_argument("--unrelated", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", type=int, nargs="+", default=[24, 32])
    parser.add_argument("--rates", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--windows", type=int, nargs="+", default=[64, 100, 128])
    args = parser.parse_args()
    pairs = build(load_sources(args.corpus, args.sources, args.seed), args.seed, args.unrelated)
    print(f"{len(pairs)} pairs from {args.sources} sources ({args.corpus or 'the bundled sample'})")
    schemes: list[tuple[str, int, Scheme]] = []
    for k in args.k:
        for rate in args.rates:
            schemes.append((f"mod p={rate}", k, lambda v, r=rate: sample_mod(v, r)))
        for window in args.windows:
            schemes.append((f"winnow w={window}", k, lambda v, w=window: winnow(v, w)))
    for name, k, pick in schemes:
        figures = evaluate(pairs, k, pick)
        print(f"\n{name}, k={k}")
        for what, value in figures.items():
            print(f"  {what:52s} {value:.4f}" if what != "anchors per KB" else f"  {what:52s} {value:.1f}")


if __name__ == "__main__":
    main()
