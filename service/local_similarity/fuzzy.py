"""Fuzzy-fingerprints (Stein 2005; Stein & Meyer zu Eissen 2006): near similarity of long chunks.

Each chunk of about 100 words is reduced to how far the frequencies of k prefix classes of its
index terms deviate from a reference distribution; the deviations, fuzzified into r intervals, form
one small integer γ per chunk. Chunks that share most of their words share γ although they are not
identical, so chunks can be an order of magnitude longer than for chunk identity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .fingerprint import U64, combine, word_hashes
from .terms import STOPWORDS

# Key of the reference distribution used when none is asked for: 12 classes keep ~4 index terms per
# class in a 100-word chunk (deviations stable under small edits) while 3^12 = 531441 hash values
# keep chance collisions between unrelated chunks rare (see bench_local.py for the measurement).
DEFAULT_K = 12


@dataclass(frozen=True)
class PrefixClass:
    """An equivalence class of index terms: those starting with one of `prefixes`."""

    prefixes: tuple[str, ...]
    p: float  # a-priori probability that an index term falls in this class


@dataclass(frozen=True)
class PrefixReference:
    """The reference prefix-class distribution (expected share of index terms per class)."""

    classes: tuple[PrefixClass, ...]
    source: str = ""
    # Expected relative frequency of each class (sums to 1).
    expected: npt.NDArray[np.float64] = field(init=False, repr=False, compare=False)
    _lookup: dict[str, int] = field(init=False, repr=False, compare=False)
    _lengths: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.classes:
            raise ValueError("prefix reference: no classes")
        lookup: dict[str, int] = {}
        for idx, cls in enumerate(self.classes):
            if not cls.prefixes:
                raise ValueError(f"prefix reference: class {idx} has no prefixes")
            if not (cls.p > 0 and math.isfinite(cls.p)):
                # a zero expectation makes the relative deviation undefined
                raise ValueError(f"prefix reference: class {idx} {cls.prefixes} has p={cls.p}")
            for prefix in cls.prefixes:
                if not prefix or prefix != prefix.casefold():
                    raise ValueError(f"prefix reference: bad prefix {prefix!r} in class {idx}")
                if prefix in lookup:
                    raise ValueError(
                        f"prefix reference: prefix {prefix!r} in classes {lookup[prefix]} and {idx}"
                    )
                lookup[prefix] = idx
        expected = np.array([c.p for c in self.classes], dtype=np.float64)
        object.__setattr__(self, "_lookup", lookup)
        object.__setattr__(self, "_lengths", tuple(sorted({len(p) for p in lookup}, reverse=True)))
        # Renormalized over the classes: chunk frequencies are shares of the terms that fall in some
        # class, so the reference must be a distribution over the same classes.
        object.__setattr__(self, "expected", expected / expected.sum())

    @property
    def k(self) -> int:
        """Number of prefix classes."""
        return len(self.classes)

    def class_of(self, term: str) -> int:
        """Index of the class of a term by its longest listed prefix, or -1 if none applies."""
        for n in self._lengths:
            idx = self._lookup.get(term[:n])
            if idx is not None:
                return idx
        return -1


_PROB_KEYS = ("p", "prob", "probability", "share", "freq", "frequency", "weight", "mass")
_PREFIX_KEYS = ("prefixes", "prefix", "letters", "members")


def _first_of(entry: Mapping[str, Any], keys: tuple[str, ...], what: str) -> Any:
    """The value under the first of `keys` the entry has: layouts name their fields differently."""
    for key in keys:
        if key in entry:
            return entry[key]
    raise ValueError(f"prefix reference: class without {what} ({sorted(entry)})")


def _prefixes_of(entry: Mapping[str, Any]) -> tuple[str, ...]:
    value = _first_of(entry, _PREFIX_KEYS, "prefixes")
    items = [value] if isinstance(value, str) else list(value)
    return tuple(str(x).casefold() for x in items)


def _classes_from(obj: Any) -> tuple[PrefixClass, ...]:
    """Classes from a list of {"prefixes": [...], "p": x} or a mapping {"a|b": x} / {"a": x}."""
    if isinstance(obj, Mapping):
        if "classes" in obj:
            return _classes_from(obj["classes"])
        return tuple(
            PrefixClass(tuple(s.casefold() for s in str(key).replace(",", "|").split("|")), float(val))
            for key, val in obj.items()
        )
    return tuple(PrefixClass(_prefixes_of(e), float(_first_of(e, _PROB_KEYS, "probability"))) for e in obj)


def _candidates(obj: Mapping[str, Any]) -> dict[int, Any]:
    """All class sets found at the top level or one level down, keyed by their k."""
    nodes: list[Any] = [obj]
    if isinstance(obj, Mapping):
        for value in obj.values():
            nodes.append(value)
            if isinstance(value, Mapping):
                nodes += value.values()
            elif isinstance(value, list):
                nodes += value
    found: dict[int, Any] = {}
    for node in nodes:
        if isinstance(node, Mapping) and "classes" in node:
            found.setdefault(int(node.get("k", len(node["classes"]))), node)
    return found


def parse_prefix_reference(obj: Mapping[str, Any], k: int | None = None) -> PrefixReference:
    """A PrefixReference from a decoded reference file, tolerant of the exact layout.

    Accepts {"k12": {"k": 12, "classes": [...]}, ...}, the same one level down (e.g. under
    "references"), a lone {"k": .., "classes": [..]}, and classes given as a list of
    {"prefixes"|"prefix": .., "p"|"prob"|"frequency": ..} or a mapping prefix -> p. Without `k`,
    DEFAULT_K is used when present, else the largest k offered.
    """
    found = _candidates(obj)
    if not found:
        raise ValueError("prefix reference: no entry with 'classes' found")
    if k is None:
        k = DEFAULT_K if DEFAULT_K in found else max(found)
    if k not in found:
        raise ValueError(f"prefix reference: no k={k} (available: {sorted(found)})")
    source = obj.get("source", "") if isinstance(obj, Mapping) else ""
    ref = PrefixReference(_classes_from(found[k]), source=str(source))
    if ref.k != k:
        raise ValueError(f"prefix reference: entry k={k} has {ref.k} classes")
    return ref


@dataclass(frozen=True)
class FuzzyParams:
    """Chunking and fuzzification of a fuzzy-fingerprint (k comes from the reference).

    `thresholds` are the r-1 ascending interval boundaries on the relative deviation
    (pf_i - p_i) / p_i, which lies in [-1, inf); δ_i is the number of boundaries it exceeds.
    """

    chunk_words: int = 100
    thresholds: tuple[float, ...] = (-0.5, 0.5)

    def __post_init__(self) -> None:
        if self.chunk_words < 4:
            raise ValueError(f"chunk_words must be >= 4, got {self.chunk_words}")
        if list(self.thresholds) != sorted(set(self.thresholds)):
            raise ValueError(f"thresholds must be strictly ascending, got {self.thresholds}")

    @property
    def r(self) -> int:
        """Number of fuzzy intervals."""
        return len(self.thresholds) + 1


DEFAULT_FUZZY = FuzzyParams()


def chunk_bounds(seq: Sequence[str], chunk_words: int) -> list[tuple[int, int]]:
    """Word ranges [start, end) of non-overlapping chunks that cover the whole sequence.

    A chunk ends after a word pair whose hash hits 1 in (chunk_words - min) — cut points
    depend on the words, not on positions, so an inserted or deleted intro moves no later boundary
    and every later chunk keeps its exact words (the paper's "100 words on average"). A chunk holds
    at least chunk_words/4 words (short chunks carry too few terms for a stable distribution) and
    at most 3 * chunk_words.
    """
    n = len(seq)
    if n == 0:
        return []
    if n <= chunk_words:
        return [(0, n)]
    min_len = max(1, chunk_words // 4)
    max_len = 3 * chunk_words
    period = np.uint64(max(1, chunk_words - min_len))
    pair = combine(word_hashes(seq), 2)  # pair[i] covers words i, i+1: a cut after word i+1
    candidates = (np.nonzero(pair % period == 0)[0] + 2).tolist()
    bounds: list[tuple[int, int]] = []
    start = 0
    # n closes the list so that the last chunk too is split at max_len; it is never a cut itself
    for cut in [*candidates, n]:
        while cut - start > max_len:
            bounds.append((start, start + max_len))
            start += max_len
        if cut - start >= min_len and n - cut >= min_len:
            bounds.append((start, cut))
            start = cut
    bounds.append((start, n))
    return bounds


def class_ids(seq: Sequence[str], reference: PrefixReference) -> npt.NDArray[np.int64]:
    """Prefix class of every word; -1 for stopwords and words in no class. Each distinct word is
    classified once."""
    table = {w: -1 if w in STOPWORDS else reference.class_of(w) for w in set(seq)}
    return np.fromiter(map(table.__getitem__, seq), dtype=np.int64, count=len(seq))


def fuzzy_hashes_of_words(
    seq: Sequence[str], reference: PrefixReference, params: FuzzyParams = DEFAULT_FUZZY
) -> U64:
    """γ = Σ δ_i r^i of every chunk with at least one index term, in chunk order."""
    r, k = params.r, reference.k
    if r**k >= 2**64:
        raise ValueError(f"r^k = {r}^{k} does not fit in 64 bits")
    bounds = chunk_bounds(seq, params.chunk_words)
    chunk_of = np.repeat(np.arange(len(bounds)), np.array([e - s for s, e in bounds], dtype=np.int64))
    ids = class_ids(seq, reference)
    keep = ids >= 0
    # index terms per chunk (rows) and class, then their relative deviation Δpf from the reference
    counts = np.bincount(chunk_of[keep] * k + ids[keep], minlength=len(bounds) * k).reshape(len(bounds), k)
    totals = counts.sum(axis=1)
    has_terms = totals > 0
    deviations = counts / np.where(has_terms, totals, 1.0)[:, None] / reference.expected - 1.0
    delta = np.searchsorted(np.asarray(params.thresholds, dtype=np.float64), deviations, side="right")
    weights = np.array([r**i for i in range(k)], dtype=np.uint64)
    gamma = (delta.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    return np.asarray(gamma[has_terms], dtype=np.uint64)


def fuzzy_fingerprint_of_words(
    seq: Sequence[str], reference: PrefixReference, params: FuzzyParams = DEFAULT_FUZZY
) -> U64:
    """h_φ(d) from normalized words: the sorted set of chunk hashes γ."""
    return np.unique(fuzzy_hashes_of_words(seq, reference, params))
