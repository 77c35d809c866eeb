"""Verdicts on the excerpt and revision set (containment_set.py) through the engine, as the
worker, embedded mode and the library give them with the containment index on: each pair in a
fresh in-memory index, the earlier text then the later one, and the later one's verdict counted.

Targets (issue 33): excerpts of at least 15% of their source and 300 characters `partial`, either
order, recall ≥ 0.99 (shorter ones: the curve by length); unrelated pairs flagged (anything but
`unique`) ≤ 0.1%; revisions keeping at least half their source `revised` or stronger, recall ≥ 0.9.

Usage:
  python tests/benchmarks/bench_containment.py [--corpus FILE] [--sources 300] [--unrelated 3000]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import neardup  # noqa: E402
from tests.benchmarks.containment_set import Pair, build, load_sources  # noqa: E402

STRONGER = {"revised", "partial", "duplicate"}


def verdict_of(pair: Pair) -> str:
    with neardup.open(containment_index=True) as dedup:
        dedup.check({"id": "earlier", "text": pair.earlier})
        return str(dedup.check({"id": "later", "text": pair.later})["verdict"])


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--sources", type=int, default=300)
    parser.add_argument("--unrelated", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    pairs = build(load_sources(args.corpus, args.sources, args.seed), args.seed, args.unrelated)
    print(f"{len(pairs)} pairs from {args.sources} sources ({args.corpus or 'the bundled sample'})")
    hits: dict[str, list[bool]] = collections.defaultdict(list)
    kinds: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for pair in pairs:
        kind = verdict_of(pair)
        kinds[pair.kind][kind] += 1
        order = "excerpt first" if pair.excerpt_first else "source first"
        if pair.kind == "unrelated":
            hits["unrelated pairs flagged (not unique)"].append(kind != "unique")
        elif pair.kind.startswith("excerpt"):
            short, long = sorted((len(pair.earlier), len(pair.later)))
            partial = kind == "partial"
            if short >= 300 and short >= 0.15 * long:
                hits[f"excerpts >=15% and >=300 chars partial, {order}"].append(partial)
            else:
                band = "<200" if short < 200 else "200-299" if short < 300 else ">=300 but <15%"
                hits[f"shorter excerpts partial, {band} chars"].append(partial)
        elif pair.kind == "revision" and pair.kept >= 0.5:
            hits["revisions keeping >=1/2: revised or stronger"].append(kind in STRONGER)
        elif pair.kind == "quoted":
            hits["a passage quoted into another text: revised or stronger"].append(kind in STRONGER)
    for name, values in sorted(hits.items()):
        print(f"  {name:60s} {sum(values) / len(values):.4f}  ({sum(values)}/{len(values)})")
    for pair_kind, counter in sorted(kinds.items()):
        print(f"  verdicts on {pair_kind}: {dict(counter)}")


if __name__ == "__main__":
    main()
