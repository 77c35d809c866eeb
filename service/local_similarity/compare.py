"""Passage-level (local) similarity, after Stein & Meyer zu Eissen (2006): the measures of a pair.

Three views of one pair of texts: chunk identity (which exact passages are shared), fuzzy-
fingerprints (which ~100-word stretches are nearly alike) and the global cosine they approximate,
each on its own or all at once (compare_local). The building blocks, on the words of one text, live
in fingerprint.py, fuzzy.py, vsm.py and terms.py; those a caller needs are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.similarity import exact_containment, exact_jaccard
from .fingerprint import (
    DEFAULT_CHUNK_WORDS,
    VerbatimPassage,
    chunk_fingerprint,
    fingerprint_of_words,
    passages_of_tokens,
)
from .fuzzy import (
    DEFAULT_FUZZY,
    FuzzyParams,
    PrefixClass,
    PrefixReference,
    fuzzy_fingerprint,
    fuzzy_fingerprint_of_words,
    parse_prefix_reference,
)
from .terms import tokenize
from .vsm import cosine_vectors, term_vector, term_vector_of_words

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


# The set measures are the engine's exact ones, so that every similarity here agrees with it on
# edge cases: two empty fingerprints are identical (1.0), an empty A is contained only in an empty B.
def local_similarity(a: str, b: str, n: int = DEFAULT_CHUNK_WORDS) -> float:
    """φ_local(A, B) = |h(A) ∩ h(B)| / |h(A) ∪ h(B)| over n-word chunk digests."""
    return exact_jaccard(chunk_fingerprint(a, n), chunk_fingerprint(b, n))


def chunk_containment(a: str, b: str, n: int = DEFAULT_CHUNK_WORDS) -> float:
    """|h(A) ∩ h(B)| / |h(A)|: the share of A's chunks that also occur in B."""
    return exact_containment(chunk_fingerprint(a, n), chunk_fingerprint(b, n))


def matching_passages(a: str, b: str, n: int = DEFAULT_CHUNK_WORDS) -> list[VerbatimPassage]:
    """Maximal passages of at least n words (or a whole shorter text) shared by A and B.

    Spans index the original strings: a[p.a_start:p.a_end] and b[p.b_start:p.b_end] hold the same
    word sequence after normalization (case, apostrophes), from first to last matched word.
    """
    return passages_of_tokens(tokenize(a), tokenize(b), n)


def fuzzy_similarity(
    a: str, b: str, reference: PrefixReference, params: FuzzyParams = DEFAULT_FUZZY
) -> float:
    """Local similarity on fuzzy-fingerprints: Jaccard of the γ sets."""
    return exact_jaccard(fuzzy_fingerprint(a, reference, params), fuzzy_fingerprint(b, reference, params))


def fuzzy_containment(
    a: str, b: str, reference: PrefixReference, params: FuzzyParams = DEFAULT_FUZZY
) -> float:
    """Share of A's γ values found among B's."""
    return exact_containment(fuzzy_fingerprint(a, reference, params), fuzzy_fingerprint(b, reference, params))


def cosine_similarity(a: str, b: str) -> float:
    """Global similarity of two texts in the vector-space model (tf over stems, no stopwords)."""
    return cosine_vectors(term_vector(a), term_vector(b))


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
    a: str, b: str, n: int = DEFAULT_CHUNK_WORDS, reference: PrefixReference | None = None
) -> LocalComparison:
    """Every measure for one pair, tokenizing each text once."""
    ta, tb = tokenize(a), tokenize(b)
    fa, fb = fingerprint_of_words(ta.words, n), fingerprint_of_words(tb.words, n)
    fuzzy: float | None = None
    if reference is not None:
        fuzzy = exact_jaccard(
            fuzzy_fingerprint_of_words(ta.words, reference), fuzzy_fingerprint_of_words(tb.words, reference)
        )
    return LocalComparison(
        n=n,
        local=exact_jaccard(fa, fb),
        containment_ab=exact_containment(fa, fb),
        containment_ba=exact_containment(fb, fa),
        fuzzy=fuzzy,
        fuzzy_k=None if reference is None else reference.k,
        cosine=cosine_vectors(term_vector_of_words(ta.words), term_vector_of_words(tb.words)),
        words_a=len(ta),
        words_b=len(tb),
        passages=tuple(passages_of_tokens(ta, tb, n)),
    )
