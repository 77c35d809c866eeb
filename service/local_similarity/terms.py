"""Words with their character offsets, English stopwords and a small suffix stemmer.

Shared by the passage-level measures (chunk identity, fuzzy-fingerprints, cosine) so that all three
see the same word sequence, and passages found on words map back to the original text.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

# A word is a run of letters/digits, with inner apostrophes kept ("don't", "Romo's") so that a
# contraction is one word in both texts. Punctuation and whitespace never belong to a word, which is
# what makes passages robust to re-wrapping and re-punctuation.
WORD_RE = re.compile(r"\w+(?:['’]\w+)*")

# Function words that carry no topic: removed before prefix classes (fuzzy-fingerprints) and before
# the cosine measure, as the paper does for its global similarity ("word stems without stopwords").
_STOPWORD_TEXT = """
    a about above after again against all also am an and any are aren't as at be because been before being
    below between both but by can can't cannot could couldn't did didn't do does doesn't doing don't down
    during each few for from further had hadn't has hasn't have haven't having he he'd he'll he's her here
    here's hers herself him himself his how how's i i'd i'll i'm i've if in into is isn't it it's its itself
    just let's may me might more most must mustn't my myself no nor not now of off on once one only or other
    ought our ours ourselves out over own said same shall shan't she she'd she'll she's should shouldn't so
    some such than that that's the their theirs them themselves then there there's these they they'd they'll
    they're they've this those through to too under until up upon us very was wasn't we we'd we'll we're
    we've were weren't what what's when when's where where's which while who who's whom whose why why's will
    with won't would wouldn't yet you you'd you'll you're you've your yours yourself yourselves
"""
STOPWORDS: frozenset[str] = frozenset(_STOPWORD_TEXT.split())


def normalize_word(word: str) -> str:
    """Case-fold and unify the typographic apostrophe, so "Don’t" and "don't" are one word."""
    return word.casefold().replace("’", "'")


@dataclass(frozen=True, eq=False)
class Tokens:
    """Normalized words of a text and the [start, end) character span of each in the original."""

    words: tuple[str, ...]
    starts: npt.NDArray[np.int64] = field(repr=False)
    ends: npt.NDArray[np.int64] = field(repr=False)

    def __len__(self) -> int:
        return len(self.words)


def tokenize(text: str) -> Tokens:
    """The normalized words of `text`, in order, with their offsets."""
    matches = list(WORD_RE.finditer(text))
    return Tokens(
        words=tuple(normalize_word(m.group()) for m in matches),
        starts=np.array([m.start() for m in matches], dtype=np.int64),
        ends=np.array([m.end() for m in matches], dtype=np.int64),
    )


# --- stemming -------------------------------------------------------------------------------------
# A simplified Porter stemmer: only step 1 (plurals, -ed/-ing, terminal y), which conflates the
# inflections that matter for comparing news wording ("talks"/"talked"/"talking") without the
# derivational steps 2-5 whose errors would merge unrelated words. Two departures from step 1a:
# "-es" after a sibilant is removed ("searches" -> "search"), and "-us" keeps its s ("status").

_VOWELS = frozenset("aeiou")


def _is_consonant(word: str, i: int) -> bool:
    """Porter's consonant: not a, e, i, o, u, nor a y after a consonant."""
    if word[i] == "y":
        return i == 0 or not _is_consonant(word, i - 1)
    return word[i] not in _VOWELS


def _measure(stem: str) -> int:
    """Porter's m in [C](VC)^m[V]: each VC ends where a vowel is followed by a consonant."""
    consonants = [_is_consonant(stem, i) for i in range(len(stem))]
    return sum(not before and after for before, after in itertools.pairwise(consonants))


def _has_vowel(stem: str) -> bool:
    return any(not _is_consonant(stem, i) for i in range(len(stem)))


def _ends_double_consonant(stem: str) -> bool:
    return len(stem) >= 2 and stem[-1] == stem[-2] and _is_consonant(stem, len(stem) - 1)


def _ends_cvc(stem: str) -> bool:
    """Consonant-vowel-consonant ending, last not w/x/y (so "hop" + e -> "hope")."""
    n = len(stem)
    if n < 3 or stem[-1] in "wxy":
        return False
    return _is_consonant(stem, n - 3) and not _is_consonant(stem, n - 2) and _is_consonant(stem, n - 1)


def stem(word: str) -> str:
    """Porter step 1a/1b/1c on a normalized word; words of one or two letters are left alone."""
    if len(word) <= 2 or not word.isalpha():
        return word
    # step 1a: plurals. "-ches", "-shes", "-xes" and "-zzes" are not in Porter's step 1a, which
    # leaves "searche" for its step 5 to finish; one rule for plurals after sibilants gives "search"
    # directly.
    if word.endswith(("sses", "ies", "ches", "shes", "xes", "zzes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us")):
        word = word[:-1]
    # step 1b: -eed, -ed, -ing
    if word.endswith("eed"):
        if _measure(word[:-3]) > 0:
            word = word[:-1]
    else:
        for suffix in ("ed", "ing"):
            if word.endswith(suffix) and _has_vowel(word[: -len(suffix)]):
                word = word[: -len(suffix)]
                if word.endswith(("at", "bl", "iz")):
                    word += "e"
                elif _ends_double_consonant(word) and word[-1] not in "lsz":
                    word = word[:-1]
                elif _measure(word) == 1 and _ends_cvc(word):
                    word += "e"
                break
    # step 1c: terminal y after a vowel-bearing stem
    if word.endswith("y") and _has_vowel(word[:-1]):
        word = word[:-1] + "i"
    return word


def stems(seq: Sequence[str]) -> list[str]:
    """Stems of the index terms of a word sequence (stopwords removed), each distinct word stemmed
    once."""
    table = {w: stem(w) for w in set(seq) - STOPWORDS}
    return [table[w] for w in seq if w in table]
