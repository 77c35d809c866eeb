"""Passage-level (local) similarity, after Stein & Meyer zu Eissen (2006): the measures of a pair.

Three views of one pair of texts, computed together on one tokenization of each (compare_local):
chunk identity (which exact passages are shared), fuzzy-fingerprints (which ~100-word stretches
are nearly alike) and the global cosine they approximate. The building blocks, on the words of one
text, live in fingerprint.py, fuzzy.py, vsm.py and terms.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.similarity import exact_containment, exact_jaccard
from .fingerprint import DEFAULT_CHUNK_WORDS, VerbatimPassage, fingerprint_of_words, passages_of_tokens
from .fuzzy import PrefixReference, fuzzy_fingerprint_of_words
from .terms import tokenize
from .vsm import cosine_vectors, term_vector_of_words


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


# The set measures are the engine's exact ones, so that every similarity here agrees with it on
# edge cases: two empty fingerprints are identical (1.0), an empty A is contained only in an empty B.
def compare_local(
    a: str, b: str, n: int = DEFAULT_CHUNK_WORDS, reference: PrefixReference | None = None
) -> LocalComparison:
    """Every measure for one pair, tokenizing each text once."""
    ta, tb = tokenize(a), tokenize(b)
    fa, fb = fingerprint_of_words(ta.words, n), fingerprint_of_words(tb.words, n)
    fuzzy: float | None = None
    if reference is not None:
        fuzzy = exact_jaccard(*(fuzzy_fingerprint_of_words(t.words, reference) for t in (ta, tb)))
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
