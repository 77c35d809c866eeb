"""Global similarity: cosine of term-frequency vectors over word stems without stopwords.

The paper's reference measure for what fingerprints approximate: it ignores word order, so it sees
a paraphrase as similar where chunk identity sees nothing in common.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

from .terms import stems

# Raw term frequency, no idf: a pairwise comparison has no collection to take document frequencies
# from, and raw tf is the plain vector-space model the paper compares against.
TermVector = Mapping[str, int]


def term_vector_of_words(seq: Sequence[str]) -> Counter[str]:
    """tf vector of the stems of the index terms of normalized words."""
    return Counter(stems(seq))


def norm(vec: TermVector) -> float:
    """Euclidean length of a tf vector."""
    return math.sqrt(sum(v * v for v in vec.values()))


def cosine_vectors(va: TermVector, vb: TermVector) -> float:
    """cos(A, B) of two tf vectors; two empty vectors are identical (1.0), one empty gives 0.0."""
    if not va or not vb:
        return 1.0 if not va and not vb else 0.0
    small, large = (va, vb) if len(va) <= len(vb) else (vb, va)
    dot = sum(v * large.get(t, 0) for t, v in small.items())
    # clamp rounding so identical texts give exactly 1.0
    return min(1.0, dot / (norm(va) * norm(vb)))
