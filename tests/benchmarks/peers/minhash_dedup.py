"""A reference near-duplicate pipeline over JSON lines, built on rensa or datasketch.

What `bench_peers.py` measures `neardup dedup` against: the pipeline a user would write with a
MinHash library. Each text is lower-cased with whitespace runs collapsed to one space, signed from
the set of its 5-character substrings (128 slots, seed 42) and queried against an LSH index of the
articles before it (threshold 0.8; rensa with 16 bands), then inserted. A candidate counts when its
estimated Jaccard is at least 0.8; the best one is the article's original. Writes one verdict line
an article, in input order: {"id", "verdict": "duplicate" | "unique", "duplicate_of"}.

It runs in the peers' own venv (tests/benchmarks/peers/requirements.txt), not the product's, and
imports only the standard library and the chosen engine, so that a run times what such a script
costs from start-up to exit.

Usage:
  BENCH_VENV/bin/python tests/benchmarks/peers/minhash_dedup.py {rensa,datasketch} IN -o OUT
      [--limit N]   (the first N articles only)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from typing import Any

NUM_PERM = 128
SEED = 42
THRESHOLD = 0.8
RENSA_BANDS = 16
SHINGLE = 5


def shingles(text: str) -> set[str]:
    """The 5-character substrings of the normalised text (the whole text when it is shorter)."""
    normal = " ".join(text.lower().split())
    if len(normal) <= SHINGLE:
        return {normal}
    return {normal[i : i + SHINGLE] for i in range(len(normal) - SHINGLE + 1)}


def articles(path: str, limit: int | None) -> Iterator[tuple[str, str]]:
    with open(path, encoding="utf-8") as lines:
        for count, line in enumerate(lines):
            if limit is not None and count >= limit:
                return
            if line.strip():
                record = json.loads(line)
                yield str(record["id"]), record["text"]


def rensa_engine() -> tuple[Callable[[set[str]], Any], Any]:
    """rensa's sketch and LSH index, built as its documentation shows."""
    from rensa import RMinHash, RMinHashLSH

    def sign(tokens: set[str]) -> Any:
        sketch = RMinHash(num_perm=NUM_PERM, seed=SEED)
        sketch.update(list(tokens))
        return sketch

    return sign, RMinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM, num_bands=RENSA_BANDS)


def datasketch_engine() -> tuple[Callable[[set[str]], Any], Any]:
    """datasketch's sketch and LSH index (its bands and rows tuned for the threshold)."""
    from datasketch import MinHash, MinHashLSH

    def sign(tokens: set[str]) -> Any:
        sketch = MinHash(num_perm=NUM_PERM, seed=SEED)
        sketch.update_batch([token.encode("utf-8") for token in tokens])
        return sketch

    return sign, MinHashLSH(threshold=THRESHOLD, num_perm=NUM_PERM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("engine", choices=("rensa", "datasketch"))
    parser.add_argument("input")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--limit", type=int, default=None, help="the first N articles only")
    args = parser.parse_args(argv)
    sign, index = rensa_engine() if args.engine == "rensa" else datasketch_engine()
    ids: list[str] = []
    sketches: list[Any] = []
    with open(args.output, "w", encoding="utf-8") as out:
        for key, (article_id, text) in enumerate(articles(args.input, args.limit)):
            sketch = sign(shingles(text))
            best, best_jaccard = None, -1.0
            for candidate in sorted(index.query(sketch)):  # the earliest of equals
                jaccard = sketch.jaccard(sketches[candidate])
                if jaccard >= THRESHOLD and jaccard > best_jaccard:
                    best, best_jaccard = candidate, jaccard
            index.insert(key, sketch)
            ids.append(article_id)
            sketches.append(sketch)
            verdict = {
                "id": article_id,
                "verdict": "unique" if best is None else "duplicate",
                "duplicate_of": None if best is None else ids[best],
            }
            out.write(json.dumps(verdict) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
