"""Passage-level (local) similarity, after Stein & Meyer zu Eissen (2006), in one comparison.

Three views of one pair of texts: chunk identity (which exact passages are shared), fuzzy-
fingerprints (which ~100-word stretches are nearly alike) and the global cosine they approximate.
The building blocks live in fingerprint.py, fuzzy.py, vsm.py and terms.py and are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .fingerprint import (
    DEFAULT_CHUNK_WORDS,
    VerbatimPassage,
    chunk_containment,
    chunk_fingerprint,
    fingerprint_of_words,
    local_similarity,
    matching_passages,
    passages_of_tokens,
    set_containment,
    set_jaccard,
)
from .fuzzy import (
    FuzzyParams,
    PrefixClass,
    PrefixReference,
    fuzzy_containment,
    fuzzy_fingerprint,
    fuzzy_fingerprint_of_words,
    fuzzy_similarity,
    parse_prefix_reference,
)
from .terms import tokenize
from .vsm import cosine_similarity, cosine_vectors, term_vector_of_words

__all__ = [
    "DEFAULT_CHUNK_WORDS",
    "FuzzyParams",
    "LocalComparison",
    "PrefixClass",
    "PrefixReference",
    "VerbatimPassage",
    "chunk_containment",
    "chunk_fingerprint",
    "compare_local",
    "cosine_similarity",
    "fuzzy_containment",
    "fuzzy_fingerprint",
    "fuzzy_similarity",
    "local_similarity",
    "matching_passages",
    "parse_prefix_reference",
]


@dataclass(frozen=True)
class LocalComparison:
    """All local and global measures of one pair, with the passages that explain them."""

    n: int  # chunk size (words) of the chunk-identity measures
    local: float  # Jaccard of n-word chunk fingerprints
    containment_ab: float  # share of A's chunks found in B
    containment_ba: float  # share of B's chunks found in A
    fuzzy: float | None  # Jaccard of fuzzy-fingerprints (DEFAULT_FUZZY); None without a reference
    fuzzy_k: int | None
    cosine: float  # tf cosine over stems without stopwords
    words_a: int
    words_b: int
    passages: tuple[VerbatimPassage, ...]


def compare_local(
    a: str,
    b: str,
    n: int = DEFAULT_CHUNK_WORDS,
    reference: PrefixReference | None = None,
) -> LocalComparison:
    """Every measure for one pair, tokenizing each text once."""
    ta, tb = tokenize(a), tokenize(b)
    fa, fb = fingerprint_of_words(ta.words, n), fingerprint_of_words(tb.words, n)
    fuzzy: float | None = None
    if reference is not None:
        fuzzy = set_jaccard(
            fuzzy_fingerprint_of_words(ta.words, reference), fuzzy_fingerprint_of_words(tb.words, reference)
        )
    return LocalComparison(
        n=n,
        local=set_jaccard(fa, fb),
        containment_ab=set_containment(fa, fb),
        containment_ba=set_containment(fb, fa),
        fuzzy=fuzzy,
        fuzzy_k=None if reference is None else reference.k,
        cosine=cosine_vectors(term_vector_of_words(ta.words), term_vector_of_words(tb.words)),
        words_a=len(ta),
        words_b=len(tb),
        passages=tuple(passages_of_tokens(ta, tb, n)),
    )
