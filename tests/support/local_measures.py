"""The measures of local_similarity one at a time, on whole texts: what compare_local computes
together on one tokenization, which the tests check each against its definition and the report's
figures against."""

from __future__ import annotations

from collections import Counter

from neardup.core.similarity import exact_containment, exact_jaccard
from neardup.local_similarity.fingerprint import (
    DEFAULT_CHUNK_WORDS,
    U64,
    VerbatimPassage,
    fingerprint_of_words,
    passages_of_tokens,
)
from neardup.local_similarity.fuzzy import (
    DEFAULT_FUZZY,
    FuzzyParams,
    PrefixReference,
    fuzzy_fingerprint_of_words,
)
from neardup.local_similarity.terms import WORD_RE, normalize_word, tokenize
from neardup.local_similarity.vsm import cosine_vectors, term_vector_of_words


def words(text: str) -> list[str]:
    """The normalized words of `text`, in order, as tokenize gives them, without their offsets."""
    found = WORD_RE.findall(text)
    if "’" in text:
        return [normalize_word(w) for w in found]
    return [w.casefold() for w in found]


def chunk_fingerprint(text: str, n: int = DEFAULT_CHUNK_WORDS) -> U64:
    """h(d) of a text for chunk-identity analysis (sorted unique uint64 digests)."""
    return fingerprint_of_words(words(text), n)


def fuzzy_fingerprint(text: str, reference: PrefixReference, params: FuzzyParams = DEFAULT_FUZZY) -> U64:
    """h_φ(d): the sorted set of chunk hashes γ of a text."""
    return fuzzy_fingerprint_of_words(words(text), reference, params)


def term_vector(text: str) -> Counter[str]:
    """tf vector of a text: stems of its words, stopwords removed."""
    return term_vector_of_words(words(text))


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
