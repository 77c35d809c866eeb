"""Canonical text → 64-bit hashes of its k-shingles (the set S_k(d)), vectorised with numpy.

A shingle's hash is a polynomial over its UTF-32 code points (mod 2**64), so no Python object
is built per shingle. Texts shorter than k have no k-shingle; they get one "whole text" hash tagged
with their length, so they match only an identical short text (exact normalized match).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import mmh3
import numpy as np

from ._hashing import U64, HashArray, fmix64
from .normalize import code_points

ShingleUnit = Literal["char", "word"]

_POLY = U64(0x9E3779B97F4A7C15)  # odd multiplier (golden ratio); wraps mod 2**64 by design
_SHORT_TAG = 0x5BD1E9955BD1E995


@dataclass(frozen=True)
class ShingleOptions:
    """How a canonical text becomes a set: k units per shingle, units are characters or words."""

    k: int = 5
    unit: ShingleUnit = "char"

    def __post_init__(self) -> None:
        if not 1 <= self.k <= 64:
            raise ValueError(f"shingle size k must be in 1..64, got {self.k}")
        if self.unit not in ("char", "word"):
            raise ValueError(f"shingle unit must be 'char' or 'word', got {self.unit!r}")


DEFAULT_SHINGLE = ShingleOptions()


def _polynomial(units: HashArray, k: int) -> HashArray:
    """Hash of every window of k units: ((u0*P + u1)*P + u2)… mod 2**64.

    Not mixed further: equal hashes mean equal windows as much as with a final fmix64 (a bijection),
    and the MinHash permutation applies fmix64 to every hash anyway."""
    windows = units.size - k + 1
    acc = units[:windows].copy()
    for offset in range(1, k):
        acc *= _POLY
        acc += units[offset : offset + windows]
    return acc


def shingle_hashes_of_units(units: HashArray, k: int) -> HashArray:
    """The shingle hashes of a unit sequence (code points or word hashes); see shingle_hashes."""
    if units.size == 0:
        return np.empty(0, dtype=U64)
    if units.size < k:
        length_tag = U64((_SHORT_TAG + units.size) & 0xFFFFFFFFFFFFFFFF)
        return fmix64(_polynomial(units, units.size) ^ length_tag)
    return _polynomial(units, k)


def shingle_hashes(text: str, options: ShingleOptions = DEFAULT_SHINGLE) -> HashArray:
    """Hashes of all k-shingles of a canonical text, with repeats (the MinHash does not mind).

    Empty text → empty array. Text shorter than k → one length-tagged hash of the whole text.
    """
    if options.unit == "char":
        units = code_points(text).astype(U64)
    else:
        words = text.split()
        units = np.fromiter((mmh3.hash64(w, signed=False)[0] for w in words), dtype=U64, count=len(words))
    return shingle_hashes_of_units(units, options.k)


def shingle_set(text: str, options: ShingleOptions = DEFAULT_SHINGLE) -> HashArray:
    """Sorted distinct shingle hashes: the set S_k(d), for exact Jaccard and containment."""
    return np.unique(shingle_hashes(text, options))


def shingle_strings(text: str, k: int = 5) -> set[str]:
    """The literal set S_k(d) of a text's k-shingles, as strings: slow, for tests and explanations
    only."""
    return {text[i : i + k] for i in range(len(text) - k + 1)}
