"""Core benchmark: signing throughput against datasketch, and MinHash accuracy against exact Jaccard.

Run from the repository root (single process; by default pinned to one CPU core):

    .venv/bin/python tests/benchmarks/bench_core.py [--repeats 5] [--pairs 350] [--no-pin]

Throughput, on news-sized texts (1-5 KB), at 128 permutations, as signatures per second:
  * ours, the `sketch_of` path: normalize + shingle + one-permutation hashing (OPH)
  * ours, normalize alone, shingle hashing alone (on normalized text), OPH alone (on shingle hashes)
  * datasketch `MinHash(num_perm=128).update_batch` over the same texts' distinct 5-shingles as
    bytes (shingles prepared outside the timing), a new MinHash per text as usually written, and
    again with the permutations shared between texts (the kindest setup for it)
  * the classic k-permutation scheme in numpy (`tests/support/scoring.py: kperm_signature`) on the same hashes
Ratios are medians of per-repeat ratios (the engines are timed interleaved, so machine load hits
all of them alike).

Accuracy: pairs built from real prose by controlled edits (word substitutions, dropped and inserted
sentences), spread over exact Jaccard 0.3-1.0, binned by exact J; per bin the RMSE of the estimate
and the theoretical sqrt(J(1-J)/m), for OPH and for k-perm (datasketch for reference).

Targets: ours >= 20x datasketch; RMSE within 10% of the theoretical average.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import datasketch  # noqa: E402
from datasketch import MinHash  # noqa: E402

from neardup.core.minhash import estimate_jaccard  # noqa: E402
from neardup.core.normalize import normalize  # noqa: E402
from neardup.core.params import DedupParams  # noqa: E402
from neardup.core.shingle import shingle_hashes, shingle_set, shingle_strings  # noqa: E402
from neardup.core.signing import sketch_of  # noqa: E402
from neardup.core.similarity import exact_jaccard  # noqa: E402
from tests.support.scoring import kperm_signature  # noqa: E402

SAMPLE = ROOT / "service" / "data" / "sample_news.jsonl"
NUM_PERM = 128
K = 5
SPEED_TARGET = 20.0
RMSE_TOLERANCE = 0.10
BINS = [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (0.6, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 1.0)]


# --------------------------------------------------------------------------- corpus


def load_corpus(limit: int, fallback: bool = False) -> tuple[list[str], str]:
    """News texts of 1-5 KB: the sample news set if present, else texts built from the seed prose."""
    if SAMPLE.exists() and not fallback:
        texts = []
        for line in SAMPLE.read_bytes().splitlines():
            if line.strip():
                text = orjson.loads(line).get("text", "")
                if 1000 <= len(text.encode("utf-8")) <= 5000:
                    texts.append(text)
        if len(texts) >= 50:
            return texts[:limit], f"{SAMPLE.relative_to(ROOT)} ({len(texts[:limit])} texts of 1-5 KB)"
    from tests.support.prose import PROSE  # the seed-derived paragraphs embedded for the unit tests

    texts = []
    for i in range(min(limit, 200)):
        order = [PROSE[(i + j) % len(PROSE)] for j in range(2 + i % 3)]
        texts.append(f"Dispatch {i}.\n\n" + "\n\n".join(order))
    return texts, f"FALLBACK: seed-derived prose ({len(texts)} texts built from 5 paragraphs)"


# --------------------------------------------------------------------------- throughput


@dataclass
class Lane:
    label: str
    run: Callable[[], object]
    items: int
    rates: list[float]


CLOCK: Callable[[], float] = time.process_time


def time_lane(lane: Lane) -> None:
    started = CLOCK()
    lane.run()
    lane.rates.append(lane.items / (CLOCK() - started))


def throughput(texts: Sequence[str], repeats: int) -> dict[str, Lane]:
    params = DedupParams(num_perm=NUM_PERM)
    hasher = params.hasher
    canonical = [normalize(t) for t in texts]
    hashes = [shingle_hashes(c) for c in canonical]
    shingles = [[s.encode("utf-8") for s in shingle_strings(c, K)] for c in canonical]
    template = MinHash(num_perm=NUM_PERM)
    permutations, scheme = template.permutations, template.scheme
    ds_sample = shingles[: max(20, len(shingles) // 4)]  # datasketch is slow: a quarter is plenty

    def ours() -> None:
        for text in texts:
            sketch_of(text, params)

    def normalizing() -> None:
        for text in texts:
            normalize(text)

    def shingling() -> None:
        for text in canonical:
            shingle_hashes(text)

    def oph() -> None:
        for h in hashes:
            hasher.signature(h)

    def kperm() -> None:
        for h in hashes:
            kperm_signature(h, NUM_PERM)

    def ds_shared() -> None:
        for batch in ds_sample:
            MinHash(num_perm=NUM_PERM, permutations=permutations, scheme=scheme).update_batch(batch)

    def ds_fresh() -> None:
        for batch in ds_sample:
            MinHash(num_perm=NUM_PERM).update_batch(batch)

    ds_texts = texts[: len(ds_sample)]

    def ds_end_to_end() -> None:
        # the same work ours does from raw text: normalize, build the shingle set, sign
        for text in ds_texts:
            shingle_set_bytes = [s.encode("utf-8") for s in shingle_strings(normalize(text), K)]
            MinHash(num_perm=NUM_PERM).update_batch(shingle_set_bytes)

    n = len(texts)
    lanes = {
        "ours": Lane("ours: sketch_of (normalize+shingle+OPH)", ours, n, []),
        "normalize": Lane("ours: normalize alone", normalizing, n, []),
        "shingle": Lane("ours: shingle hashing alone", shingling, n, []),
        "oph": Lane("ours: OPH alone", oph, n, []),
        "kperm": Lane("k-perm numpy (kperm_signature) alone", kperm, n, []),
        "ds_fresh": Lane("datasketch MinHash(128).update_batch", ds_fresh, len(ds_sample), []),
        "ds": Lane("datasketch, permutations shared", ds_shared, len(ds_sample), []),
        "ds_e2e": Lane("datasketch from raw text (normalize+shingle)", ds_end_to_end, len(ds_texts), []),
    }
    ours()  # warm caches (tables, lru_cache) before timing
    for _ in range(repeats):
        for lane in lanes.values():
            time_lane(lane)
    return lanes


# --------------------------------------------------------------------------- accuracy

_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def edit(
    text: str, rate: float, donors: Sequence[str], vocabulary: Sequence[str], rng: np.random.Generator
) -> str:
    """A controlled rewrite: substitute words, drop sentences, insert sentences from another text."""
    sentences = _SENTENCE.split(text)
    out = []
    for sentence in sentences:
        roll = rng.random()
        if roll < rate * 0.25 and len(sentences) > 2:
            continue  # dropped
        words = sentence.split()
        for i in range(len(words)):
            if rng.random() < rate * 0.5:
                words[i] = vocabulary[int(rng.integers(len(vocabulary)))]
        out.append(" ".join(words))
        if rng.random() < rate * 0.2:
            donor = _SENTENCE.split(donors[int(rng.integers(len(donors)))])
            out.append(donor[int(rng.integers(len(donor)))])
    return " ".join(out)


def make_pairs(texts: Sequence[str], count: int, seed: int = 7) -> list[tuple[str, str, float]]:
    """`count` pairs spread evenly over the bins of exact Jaccard (0.3-1.0, identical pairs excluded)."""
    rng = np.random.default_rng(seed)
    vocabulary = sorted({w for t in texts[:50] for w in t.split() if w.isalpha()})
    quota = -(-count // len(BINS))
    filled: dict[int, list[tuple[str, str, float]]] = {i: [] for i in range(len(BINS))}
    attempts = 0
    while any(len(v) < quota for v in filled.values()) and attempts < 200 * count:
        attempts += 1
        base = texts[int(rng.integers(len(texts)))]
        variant = edit(base, float(rng.uniform(0.0, 0.6)), texts, vocabulary, rng)
        j = exact_jaccard(shingle_set(normalize(base)), shingle_set(normalize(variant)))
        for i, (lo, hi) in enumerate(BINS):
            if lo <= j < hi and len(filled[i]) < quota:
                filled[i].append((base, variant, j))
    return [pair for i in range(len(BINS)) for pair in filled[i]]


@dataclass
class Accuracy:
    exact: np.ndarray
    estimates: dict[str, np.ndarray]
    verified: np.ndarray  # the verification sketch's estimates (what verdicts use)
    verify_perm: int


def accuracy(pairs: Sequence[tuple[str, str, float]], with_datasketch: bool) -> Accuracy:
    params = DedupParams(num_perm=NUM_PERM)
    exact = np.array([j for _, _, j in pairs])
    oph, kperm, ds, verified = [], [], [], []
    for a, b, _ in pairs:
        fa, fb = sketch_of(a, params), sketch_of(b, params)
        oph.append(estimate_jaccard(fa.signature, fb.signature))
        verified.append(fa.estimate_jaccard(fb))
        ha, hb = shingle_hashes(normalize(a)), shingle_hashes(normalize(b))
        kperm.append(estimate_jaccard(kperm_signature(ha, NUM_PERM), kperm_signature(hb, NUM_PERM)))
        if with_datasketch:
            ma, mb = MinHash(num_perm=NUM_PERM), MinHash(num_perm=NUM_PERM)
            ma.update_batch([s.encode() for s in shingle_strings(normalize(a), K)])
            mb.update_batch([s.encode() for s in shingle_strings(normalize(b), K)])
            ds.append(ma.jaccard(mb))
    estimates = {"OPH (ours)": np.array(oph), "k-perm": np.array(kperm)}
    if with_datasketch:
        estimates["datasketch"] = np.array(ds)
    return Accuracy(exact, estimates, np.array(verified), params.verify_perm)


def rmse(est: np.ndarray, exact: np.ndarray) -> float:
    return float(np.sqrt(np.mean((est - exact) ** 2)))


def theory(exact: np.ndarray) -> float:
    return float(np.sqrt(np.mean(exact * (1 - exact) / NUM_PERM)))


# --------------------------------------------------------------------------- report


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def pin_to_one_core(enabled: bool) -> str:
    if not enabled or not hasattr(os, "sched_setaffinity"):
        return "not pinned (use `taskset -c 0 ...` for steadier figures)"
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return f"pinned to CPU {cpu}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (>= 5 for the medians)")
    parser.add_argument("--pairs", type=int, default=350, help="pairs for the accuracy table (>= 300)")
    parser.add_argument("--texts", type=int, default=500, help="at most this many texts for throughput")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the process to one core")
    parser.add_argument("--wall", action="store_true", help="wall-clock instead of process CPU time")
    parser.add_argument(
        "--fallback", action="store_true", help="use the seed prose even if the sample exists"
    )
    parser.add_argument("--no-datasketch-accuracy", action="store_true", help="skip datasketch estimates")
    args = parser.parse_args(argv)

    global CLOCK
    CLOCK = time.perf_counter if args.wall else time.process_time
    pinned = pin_to_one_core(not args.no_pin)
    texts, source = load_corpus(args.texts, args.fallback)
    sizes = [len(t.encode("utf-8")) for t in texts]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print("neardup core benchmark")
    print(
        f"python {platform.python_version()}, numpy {np.__version__}, datasketch {datasketch.__version__}; "
        f"single process, {pinned}; load average {load:.2f} on {os.cpu_count()} CPUs"
    )
    print(f"corpus: {source}; sizes {min(sizes)}-{max(sizes)} B, median {int(np.median(sizes))} B")
    print()

    lanes = throughput(texts, args.repeats)
    clock = "wall-clock" if args.wall else "process CPU time (robust to other load on the machine)"
    print(f"throughput, {NUM_PERM} permutations, median of {args.repeats} repeats, {clock}")
    print(f"  {'engine':<44} {'signatures/s':>13} {'us/text':>9}")
    for lane in lanes.values():
        rate = statistics.median(lane.rates)
        print(f"  {lane.label:<44} {rate:>13,.0f} {1e6 / rate:>9.1f}")
    ratio_fresh = statistics.median(
        o / d for o, d in zip(lanes["ours"].rates, lanes["ds_fresh"].rates, strict=True)
    )
    ratio_ds = statistics.median(o / d for o, d in zip(lanes["ours"].rates, lanes["ds"].rates, strict=True))
    ratio_e2e = statistics.median(
        o / d for o, d in zip(lanes["ours"].rates, lanes["ds_e2e"].rates, strict=True)
    )
    ratio_prepared = statistics.median(
        o / d for o, d in zip(lanes["oph"].rates, lanes["ds_fresh"].rates, strict=True)
    )
    ratio_kperm = statistics.median(
        o / k for o, k in zip(lanes["oph"].rates, lanes["kperm"].rates, strict=True)
    )
    print(
        f"  ours / datasketch                  {ratio_fresh:6.1f}x   target >= {SPEED_TARGET:.0f}x   "
        f"{verdict(ratio_fresh >= SPEED_TARGET)}"
    )
    print(
        f"  ours / datasketch, shared perms    {ratio_ds:6.1f}x   (stricter) "
        f"{verdict(ratio_ds >= SPEED_TARGET)}"
    )
    print(
        f"  ours / datasketch, both from raw text {ratio_e2e:6.1f}x   target >= {SPEED_TARGET:.0f}x   "
        f"{verdict(ratio_e2e >= SPEED_TARGET)}"
    )
    print(
        f"  OPH / datasketch, both from prepared shingles {ratio_prepared:6.1f}x   "
        f"{verdict(ratio_prepared >= SPEED_TARGET)}"
    )
    print(f"  OPH / k-perm (signing alone)       {ratio_kperm:6.1f}x")
    print()

    pairs = make_pairs(texts, args.pairs)
    result = accuracy(pairs, with_datasketch=not args.no_datasketch_accuracy)
    exact = result.exact
    print(f"accuracy: {len(pairs)} pairs, m={NUM_PERM}; RMSE of the Jaccard estimate by exact-J bin")
    header = f"  {'bin':<10} {'n':>4} {'mean J':>7} {'theory':>7}"
    for name in result.estimates:
        header += f" {name:>12}"
    print(header)
    per_bin_ratios: dict[str, list[float]] = {name: [] for name in result.estimates}
    for lo, hi in BINS:
        mask = (exact >= lo) & (exact < hi)
        if not mask.any():
            print(f"  {lo:.1f}-{hi:.1f}    {0:>4}")
            continue
        expected = theory(exact[mask])
        row = f"  {lo:.1f}-{hi:.1f}    {int(mask.sum()):>4} {exact[mask].mean():>7.3f} {expected:>7.4f}"
        for name, est in result.estimates.items():
            value = rmse(est[mask], exact[mask])
            per_bin_ratios[name].append(value / expected)
            row += f" {value:>12.4f}"
        print(row)
    expected_all = theory(exact)
    print(f"  {'all':<10} {len(exact):>4} {exact.mean():>7.3f} {expected_all:>7.4f}", end="")
    for est in result.estimates.values():
        print(f" {rmse(est, exact):>12.4f}", end="")
    print()
    for name, est in result.estimates.items():
        ratio = rmse(est, exact) / expected_all
        bias = float(np.mean(est - exact))
        mean_bin_ratio = float(np.mean(per_bin_ratios[name]))
        judged = name != "datasketch"
        status = verdict(abs(ratio - 1.0) <= RMSE_TOLERANCE) if judged else "(reference)"
        print(
            f"  {name:<12} RMSE/theory {ratio:.3f} (mean of bin ratios {mean_bin_ratio:.3f}), "
            f"bias {bias:+.4f}   target within {RMSE_TOLERANCE:.0%}   {status}"
        )
    m = result.verify_perm
    expected_verified = float(np.sqrt(np.mean(exact * (1 - exact) / m)))
    ratio = rmse(result.verified, exact) / expected_verified
    print(
        f"  verifier ({m} slots, what verdicts use): RMSE {rmse(result.verified, exact):.4f}, "
        f"theory sqrt(J(1-J)/{m}) {expected_verified:.4f}, ratio {ratio:.3f}, "
        f"bias {float(np.mean(result.verified - exact)):+.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
