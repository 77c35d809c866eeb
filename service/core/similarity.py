"""Exact similarity measures: the ground truth that MinHash and LSH are judged against."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ._hashing import HashArray


def _intersection_size(a: HashArray, b: HashArray) -> int:
    return int(np.intersect1d(a, b, assume_unique=True).size)


def exact_jaccard(a: HashArray, b: HashArray) -> float:
    """|A∩B| / |A∪B| of two distinct-sorted hash sets; two empty sets are identical (1.0)."""
    if a.size == 0 and b.size == 0:
        return 1.0
    inter = _intersection_size(a, b)
    return inter / (a.size + b.size - inter)


def exact_containment(a: HashArray, b: HashArray) -> float:
    """|A∩B| / |A|: the share of A found in B (1.0 for a truncated copy A of B)."""
    if a.size == 0:
        return 1.0 if b.size == 0 else 0.0
    return _intersection_size(a, b) / a.size


def blocks(text: str, width: int = 4) -> list[str]:
    """The blocks of block similarity: consecutive non-overlapping runs of `width` characters, the
    last one padded with spaces. Line ends are ordinary characters."""
    if len(text) % width:
        text += " " * (width - len(text) % width)
    return [text[i : i + width] for i in range(0, len(text), width)]


def _block_similarity_one_way(first: list[str], second: list[str]) -> float:
    """s / max(n, m), where each block of `first` seen for the first time takes every equal block
    out of `second` and counts them: by the measure's definition a block repeated in `first`
    counts once, with all its copies in `second`."""
    if not first and not second:
        return 1.0
    remaining = Counter(second)
    left = len(second)
    matched = 0
    for block in first:
        if left == 0:
            break
        count = remaining.pop(block, 0)
        matched += count
        left -= count
    return matched / max(len(first), len(second))


def block_similarity(text_a: str, text_b: str, width: int = 4) -> float:
    """4-character block similarity, computed in both directions, minimum taken so that the
    measure is symmetric."""
    a, b = blocks(text_a, width), blocks(text_b, width)
    return min(_block_similarity_one_way(a, b), _block_similarity_one_way(b, a))
