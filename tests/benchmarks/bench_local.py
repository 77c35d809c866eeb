"""Chunk-identity versus fuzzy-fingerprints, in the setting of Stein & Meyer zu Eissen (2006).

Figure 3: 50 documents drawn at random are compared against collection subsets of 100..800
documents through an inverted index (hash -> documents); we count hash collisions (fingerprint
entries of a query found in a collection document) and time fingerprinting + indexing + lookup,
median of repeated runs, for chunk identity (n = 3..10 words) and fuzzy-fingerprints (~100 words).

Figure 4: over all query x collection pairs, the mean deviation of each local similarity (Jaccard
of fingerprints) from the cosine similarity (tf over stems, no stopwords), binned by cosine; and
the deviation of fuzzy-fingerprints from the finest chunk identity (n = 3), binned by the latter.

Usage:
  python tests/benchmarks/bench_local.py [--collection DIR] [--repeats 3] [--json out.json]

The collection (versioned documents: one .txt per document and index.jsonl with
{"id", "family", "version", "path"}) is built by tests/benchmarks/build_versioned_collection.py.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from neardup.local_similarity.fingerprint import fingerprint_of_words  # noqa: E402
from neardup.local_similarity.fuzzy import FuzzyParams, PrefixReference, fuzzy_fingerprint_of_words  # noqa: E402
from neardup.local_similarity.report import REFERENCE_PATH, load_prefix_reference  # noqa: E402
from neardup.local_similarity.vsm import term_vector_of_words  # noqa: E402
from tests.support.local_measures import words  # noqa: E402

DEFAULT_COLLECTION = Path.home() / ".cache" / "neardup" / "versioned"
SIZES = (100, 200, 300, 400, 500, 600, 700, 800)
BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0 + 1e-9)
U64 = npt.NDArray[np.uint64]
Fingerprinter = Callable[[Sequence[str]], U64]


@dataclass(frozen=True)
class Doc:
    id: str
    family: str
    text: str


@dataclass(frozen=True)
class Method:
    """A fingerprint over normalized words; `from_text` adds tokenization to its cost."""

    name: str
    of_words: Fingerprinter

    def fingerprint(self, doc: str | Sequence[str]) -> U64:
        return self.of_words(words(doc) if isinstance(doc, str) else doc)


@dataclass(frozen=True)
class Run:
    """One timed analysis: fingerprints of subset and queries, index, lookup."""

    fingerprint_s: float
    index_s: float
    lookup_s: float
    collisions: int
    index_entries: int
    inter: npt.NDArray[np.int64]  # queries x subset: |h(q) ∩ h(d)|
    sizes_q: npt.NDArray[np.int64]
    sizes_d: npt.NDArray[np.int64]

    @property
    def total_s(self) -> float:
        return self.fingerprint_s + self.index_s + self.lookup_s


def load_collection(root: Path) -> list[Doc]:
    index = root / "index.jsonl"
    if not index.exists():
        raise SystemExit(
            f"no collection at {root} (missing {index.name}).\n"
            "Build it with:  .venv/bin/python tests/benchmarks/build_versioned_collection.py"
            + (f" --out {root}" if root != DEFAULT_COLLECTION else "")
            + "\nor point --collection at a directory with index.jsonl "
            '({"id", "family", "version", "path"} per line) and the .txt files.'
        )
    docs = []
    with index.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                text = (root / row["path"]).read_text(encoding="utf-8", errors="replace")
                docs.append(Doc(str(row["id"]), str(row["family"]), text))
    return docs


Input = str | Sequence[str]  # raw text, or its words when tokenization is left out of the timing


def analyse(method: Method, queries: Sequence[Input], subset: Sequence[Input]) -> Run:
    """Fingerprint everything, index the subset (sorted hash -> doc arrays), look up queries."""
    t0 = time.perf_counter()
    fps_d = [method.fingerprint(d) for d in subset]
    fps_q = [method.fingerprint(q) for q in queries]
    t1 = time.perf_counter()
    keys = np.concatenate(fps_d) if fps_d else np.empty(0, dtype=np.uint64)
    owners = np.repeat(np.arange(len(fps_d)), [f.size for f in fps_d])
    order = np.argsort(keys, kind="stable")
    keys, owners = keys[order], owners[order]
    t2 = time.perf_counter()
    inter = np.zeros((len(queries), len(subset)), dtype=np.int64)
    collisions = 0
    for qi, fq in enumerate(fps_q):
        lo = np.searchsorted(keys, fq, side="left")
        hi = np.searchsorted(keys, fq, side="right")
        counts = hi - lo
        total = int(counts.sum())
        collisions += total
        if total:
            hit = np.nonzero(counts)[0]
            starts = np.repeat(lo[hit] - np.cumsum(counts[hit]) + counts[hit], counts[hit])
            posting = starts + np.arange(total)
            inter[qi] = np.bincount(owners[posting], minlength=len(subset))
    t3 = time.perf_counter()
    return Run(
        fingerprint_s=t1 - t0,
        index_s=t2 - t1,
        lookup_s=t3 - t2,
        collisions=collisions,
        index_entries=int(keys.size),
        inter=inter,
        sizes_q=np.array([f.size for f in fps_q], dtype=np.int64),
        sizes_d=np.array([f.size for f in fps_d], dtype=np.int64),
    )


def jaccard_matrix(run: Run) -> npt.NDArray[np.float64]:
    union = run.sizes_q[:, None] + run.sizes_d[None, :] - run.inter
    return np.divide(run.inter, union, out=np.zeros(union.shape), where=union > 0)


def cosine_matrix(queries: Sequence[Doc], subset: Sequence[Doc]) -> npt.NDArray[np.float64]:
    """Exact tf cosine (stems, no stopwords) of every query x subset pair."""
    vectors = [term_vector_of_words(words(d.text)) for d in [*queries, *subset]]
    vocab: dict[str, int] = {}
    for vec in vectors:
        for term in vec:
            vocab.setdefault(term, len(vocab))
    dense = np.zeros((len(vectors), len(vocab)), dtype=np.float32)
    for row, vec in enumerate(vectors):
        dense[row, [vocab[t] for t in vec]] = list(vec.values())
    norms = np.linalg.norm(dense, axis=1)
    dense /= np.where(norms > 0, norms, 1.0)[:, None]
    nq = len(queries)
    return np.clip(dense[:nq] @ dense[nq:].T, 0.0, 1.0).astype(np.float64)


def binned_deviation(
    value: npt.NDArray[np.float64], against: npt.NDArray[np.float64]
) -> list[tuple[int, float, float]]:
    """Per bin of `against`: pair count, mean |value - against|, mean (value - against)."""
    out = []
    for lo, hi in itertools.pairwise(BINS):
        mask = (against >= lo) & (against < hi)
        n = int(mask.sum())
        if n:
            diff = value[mask] - against[mask]
            out.append((n, float(np.abs(diff).mean()), float(diff.mean())))
        else:
            out.append((0, float("nan"), float("nan")))
    return out


def md5_fingerprint(seq: Sequence[str], n: int) -> U64:
    """The paper's baseline encoding: MD5 of each n-word chunk string, first 8 bytes kept."""
    chunks = [" ".join(seq[i : i + n]) for i in range(max(1, len(seq) - n + 1))] if seq else []
    digests = [
        int.from_bytes(hashlib.md5(c.encode(), usedforsecurity=False).digest()[:8], "little") for c in chunks
    ]
    return np.unique(np.array(digests, dtype=np.uint64))


def make_methods(
    chunk_sizes: Sequence[int],
    md5_sizes: Sequence[int],
    reference: PrefixReference,
    params: FuzzyParams,
) -> list[Method]:
    """Chunk identity (our hash), chunk identity with MD5, and the fuzzy-fingerprint last."""
    methods = [Method(f"chunk n={n}", partial(fingerprint_of_words, n=n)) for n in chunk_sizes]
    methods += [Method(f"md5 n={n}", partial(md5_fingerprint, n=n)) for n in md5_sizes]
    label = f"fuzzy ~{params.chunk_words}w k={reference.k} r={params.r}"
    methods.append(Method(label, partial(fuzzy_fingerprint_of_words, reference=reference, params=params)))
    return methods


def median_of(runs: Sequence[Run]) -> Run:
    """Median times of repeated runs (collisions and intersections are deterministic)."""
    first = runs[0]
    return Run(
        fingerprint_s=statistics.median(r.fingerprint_s for r in runs),
        index_s=statistics.median(r.index_s for r in runs),
        lookup_s=statistics.median(r.lookup_s for r in runs),
        collisions=first.collisions,
        index_entries=first.index_entries,
        inter=first.inter,
        sizes_q=first.sizes_q,
        sizes_d=first.sizes_d,
    )


def timed_all(
    methods: Sequence[Method], queries: Sequence[Input], subset: Sequence[Input], repeats: int
) -> dict[str, Run]:
    """Repeat every method, interleaved and in rotating order, so that background load on the
    machine spreads over all methods alike; report medians."""
    runs: dict[str, list[Run]] = {m.name: [] for m in methods}
    for rep in range(repeats):
        shift = rep % len(methods)
        for method in [*methods[shift:], *methods[:shift]]:
            runs[method.name].append(analyse(method, queries, subset))
    return {name: median_of(rs) for name, rs in runs.items()}


def fmt_bins(rows: list[tuple[int, float, float]]) -> str:
    return "  ".join("     -     " if n == 0 else f"{mad:.3f}({sd:+.2f})" for n, mad, sd in rows)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--collection", type=Path, default=DEFAULT_COLLECTION)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--chunk-sizes", default="3,4,5,6,7,8,9,10")
    ap.add_argument("--report", default="3,5", help="chunk sizes shown in the Figure 3 table")
    ap.add_argument("--md5", default="3,5", help="chunk sizes also run with MD5 ('' for none)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=2006)
    ap.add_argument("--reference", type=Path, default=REFERENCE_PATH)
    ap.add_argument("--k", type=int, default=None, help="prefix classes (default: reference's)")
    ap.add_argument("--fuzzy-chunk", type=int, default=100)
    ap.add_argument("--thresholds", default="-0.5,0.5", help="fuzzy interval boundaries")
    ap.add_argument("--json", type=Path, default=None, help="write all numbers here")
    args = ap.parse_args(argv)

    docs = load_collection(args.collection.expanduser())
    sizes = [int(s) for s in args.sizes.split(",")]
    chunk_sizes = [int(s) for s in args.chunk_sizes.split(",")]
    report = [int(s) for s in args.report.split(",")]
    if len(docs) < args.queries + max(sizes):
        raise SystemExit(f"collection has {len(docs)} documents; need {args.queries} queries + {max(sizes)}")
    reference = load_prefix_reference(args.reference, args.k)
    params = FuzzyParams(
        chunk_words=args.fuzzy_chunk,
        thresholds=tuple(float(x) for x in args.thresholds.split(",")),
    )
    rng = random.Random(args.seed)
    shuffled = docs[:]
    rng.shuffle(shuffled)
    queries, pool = shuffled[: args.queries], shuffled[args.queries :]
    md5_sizes = [int(s) for s in args.md5.split(",") if s]
    methods = make_methods(chunk_sizes, md5_sizes, reference, params)
    fuzzy = methods[-1]
    n_words = sum(len(words(d.text)) for d in pool[: max(sizes)])
    print(
        f"collection {args.collection} ({len(docs)} docs); {len(queries)} queries; subsets "
        f"{sizes[0]}..{sizes[-1]} (largest: {n_words} words); median of {args.repeats} runs"
    )
    print(f"fuzzy: {params}, reference k={reference.k} ({reference.source[:60]}...)")

    t_tok = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for d in [*pool[: max(sizes)], *queries]:
            words(d.text)
        t_tok.append(time.perf_counter() - t0)
    print(f"tokenization alone, largest subset + queries: {statistics.median(t_tok):.3f} s\n")

    results: dict[str, dict[int, Run]] = {m.name: {} for m in methods}
    q_texts = [q.text for q in queries]
    for size in sizes:
        subset = [d.text for d in pool[:size]]
        for name, run in timed_all(methods, q_texts, subset, args.repeats).items():
            results[name][size] = run
    # the same analysis at the largest size with tokenization done beforehand (shared by all)
    q_words = [words(q.text) for q in queries]
    d_words = [words(d.text) for d in pool[: max(sizes)]]
    pretok = timed_all(methods, q_words, d_words, args.repeats)

    # --- Figure 3 ---
    wanted = {f"chunk n={n}" for n in report} | {f"md5 n={n}" for n in report}
    shown = [m for m in methods if m.name in wanted] + [fuzzy]
    head = "size " + "".join(f"| {m.name:>28s} " for m in shown)
    head += "".join(f"| {'x ' + m.name:>11s}" for m in shown[:-1])
    print("Figure 3: collisions (fingerprint-entry matches) and runtime in s (fp + index + lookup)")
    print(head)
    for size in sizes:
        cells = "".join(
            f"| {results[m.name][size].collisions:>12,d} {results[m.name][size].total_s:>7.3f} s "
            for m in shown
        )
        ups = "".join(
            f"| {results[m.name][size].total_s / results[fuzzy.name][size].total_s:>11.1f}"
            for m in shown[:-1]
        )
        print(f"{size:>4d} {cells}{ups}")

    big = max(sizes)
    for title, table in (
        (
            f"All methods at {big} documents, from raw text",
            {m.name: results[m.name][big] for m in methods},
        ),
        (f"All methods at {big} documents, words tokenized beforehand", pretok),
    ):
        print(f"\n{title} (runtime split; speed-up = time / fuzzy time)")
        print(
            f"{'method':>28s} | {'index entries':>13s} | {'collisions':>11s} | {'fp s':>6s} | "
            f"{'index s':>7s} | {'lookup s':>8s} | {'total s':>7s} | speed-up | index+lookup x"
        )
        fz_run = table[fuzzy.name]
        for m in methods:
            r = table[m.name]
            print(
                f"{m.name:>28s} | {r.index_entries:>13,d} | {r.collisions:>11,d} | "
                f"{r.fingerprint_s:>6.3f} | {r.index_s:>7.3f} | {r.lookup_s:>8.4f} | "
                f"{r.total_s:>7.3f} | {r.total_s / fz_run.total_s:>8.1f} | "
                f"{(r.index_s + r.lookup_s) / (fz_run.index_s + fz_run.lookup_s):>14.1f}"
            )

    # --- Figure 4 ---
    subset_docs = pool[:big]
    cos = cosine_matrix(queries, subset_docs).ravel()
    sims = {m.name: jaccard_matrix(results[m.name][big]).ravel() for m in methods}
    labels = [f"{lo:.1f}-{min(hi, 1.0):.1f}" for lo, hi in itertools.pairwise(BINS)]
    counts = [int(((cos >= lo) & (cos < hi)).sum()) for lo, hi in itertools.pairwise(BINS)]
    print(
        f"\nFigure 4 (left): mean |local - cosine| (and mean signed local - cosine) by cosine bin, "
        f"{cos.size} pairs"
    )
    print(f"{'cosine bin':>28s}   " + "  ".join(f"{lab:^11s}" for lab in labels) + "   all")
    print(f"{'pairs':>28s}   " + "  ".join(f"{c:^11d}" for c in counts))
    fig4: dict[str, list[tuple[int, float, float]]] = {}
    for m in methods:
        rows = binned_deviation(sims[m.name], cos)
        fig4[m.name] = rows
        overall = float(np.abs(sims[m.name] - cos).mean())
        print(f"{m.name:>28s}   {fmt_bins(rows)}   {overall:.3f}")

    ref_name = f"chunk n={min(chunk_sizes)}"
    print(f"\nFigure 4 (right): mean |fuzzy - {ref_name}| by {ref_name} bin")
    rows_r = binned_deviation(sims[fuzzy.name], sims[ref_name])
    counts_r = [n for n, _, _ in rows_r]
    print(f"{'bin':>28s}   " + "  ".join(f"{lab:^11s}" for lab in labels))
    print(f"{'pairs':>28s}   " + "  ".join(f"{c:^11d}" for c in counts_r))
    print(f"{fuzzy.name:>28s}   {fmt_bins(rows_r)}")

    same = np.array([[q.family == d.family for d in subset_docs] for q in queries]).ravel()
    print(f"\nSame-family pairs ({int(same.sum())}) vs others: mean similarity")
    print(f"{'measure':>28s} | {'same family':>11s} | {'other':>7s}")
    print(f"{'cosine':>28s} | {cos[same].mean():>11.3f} | {cos[~same].mean():>7.3f}")
    for m in methods:
        sim = sims[m.name]
        print(f"{m.name:>28s} | {sim[same].mean():>11.3f} | {sim[~same].mean():>7.3f}")

    if args.json:
        out = {
            "collection": str(args.collection),
            "queries": [q.id for q in queries],
            "sizes": sizes,
            "fuzzy_params": {
                "chunk_words": params.chunk_words,
                "chunking": "content",
                "thresholds": list(params.thresholds),
                "k": reference.k,
            },
            "figure3": {
                m.name: {
                    str(s): {
                        "collisions": r.collisions,
                        "index_entries": r.index_entries,
                        "fingerprint_s": r.fingerprint_s,
                        "index_s": r.index_s,
                        "lookup_s": r.lookup_s,
                        "total_s": r.total_s,
                    }
                    for s, r in results[m.name].items()
                }
                for m in methods
            },
            "figure4_bins": labels,
            "figure4": {k: [list(row) for row in v] for k, v in fig4.items()},
            "pretokenized": {
                m.name: {"total_s": r.total_s, "fingerprint_s": r.fingerprint_s}
                for m, r in ((m, pretok[m.name]) for m in methods)
            },
        }
        args.json.write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
