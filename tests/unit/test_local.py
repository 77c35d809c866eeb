"""Passage-level similarity: chunk identity, fuzzy-fingerprints, cosine, and the terminal report.

Cases follow Stein & Meyer zu Eissen (2006): their Figure 1 texts, and news paragraphs edited in the
ways local similarity is meant to see (a copy with new intro and footer, a truncated copy, a
paraphrase) or not to see (different texts on one topic). Expected values are derived from chunk
counts wherever the construction allows it.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from neardup.core.normalize import normalize
from neardup.core.shingle import shingle_set
from neardup.core.similarity import exact_containment, exact_jaccard
from neardup.local_similarity import fuzzy as fz
from neardup.local_similarity.compare import compare_local
from neardup.local_similarity.fingerprint import (
    VerbatimPassage,
    chunk_hashes,
    fingerprint_of_words,
    word_passages,
)
from neardup.local_similarity.fuzzy import FuzzyParams, PrefixClass, PrefixReference, parse_prefix_reference
from neardup.local_similarity.report import (
    REFERENCE_PATH,
    load_prefix_reference,
    render_compare_local,
)
from neardup.local_similarity.terms import STOPWORDS, stem, tokenize
from tests.support.local_measures import (
    chunk_containment,
    chunk_fingerprint,
    cosine_similarity,
    fuzzy_containment,
    fuzzy_fingerprint,
    fuzzy_similarity,
    local_similarity,
    matching_passages,
    term_vector,
    words,
)

# --- texts ------------------------------------------------------------------------------------
# Figure 1 of the paper, documents A and B, as printed (hard-wrapped, hyphenated line breaks).
FIG1_A = """\
Drawing the conclusion ``knowledge over search'' is obvious on
the one hand, but too simple on the other: Among others, the
question remains what can be done if the resource ``design know-
ledge'' is not available or cannot be elicited, or is too expensive,
or must tediously be experienced? Obviously we can learn from
human problem solvers where to spend search effort deliberately
in order to gain the maximum impact for automated problem
solving. The paper in hand gives such an example: In Subsection
2.1 we introduce the paradigm of functional abstraction to address
behavior-based design problems. It develops from the search-
plus-simulation paradigm by untwining the roles of search and
simulation; in this way it forms a synthesis of the aforementioned
approaches.
"""

FIG1_B = """\
at the first sight ``knowledge over search'' is obvious on the one
hand, but too simple on the other: Among others, the question
remains whether or not he could believe the alleged claim.
However, most of us think that it develops from the search-plus-
simulation paradigm. This way one could gain the maximum
impact for automated diagnosis problem solving, simply by un-
twining the roles of search and simulation.
Human problem solving expertise is highly effective but of heu-
ristic nature; moreover, it is hard to elicit but rather easy to
process. Successful implementations of knowledge-based design
algorithms don´t search in a gigantic space of behavior models
but operate in a well defined structure space instead, which is
spanned by compositional and taxonomic relations.
"""

# News paragraphs (a sports wire story and a holiday explainer) and two short articles on one
# topic (shingling and Jaccard similarity), from the project's seed documents.
ROMO = """\
NFC East rival quarterbacks Tony Romo(notes) of the Dallas Cowboys and Eli Manning(notes) of the
New York Giants now have something else in common — they've used the same wedding planner to
help them tie the knot. Todd Fiscus, the man with the plan, set up what he called "man food" at
Dallas' Arlington Hall on Saturday, when Romo married former Miss Missouri Candace Crawford. "I
have a lot of football players to feed," said Fiscus, who had pizza and short ribs on the menu.

However, Romo apparently put all the tunes together. "Tony picked out every song, and when it
plays, and what the keynote things are," Fiscus said.

Sounds like a very orderly occasion, but there was one wild card — whether Cowboys owner Jerry
Jones would be able to attend. With the continued lockout, owners and players are not supposed
to have any contact away from the negotiating table. But Jones received special dispensation
from the NFL to attend, just as the Green Bay Packers recently were informed that they will, in
fact, receive their Super Bowl rings in a June 16 ceremony no matter what the labor situation is
at that time. Jones was there along with virtually all of Romo's teammates.

It is unknown whether Jones and Romo actually discussed any labor issues at the wedding — we're
guessing this was more of a "friendly", though Jones is one of the most powerful owners on the
NFL's side of things and Romo's marquee value gives him a lot of play on the other side.

"I've gotten special permission," Jones recently told ESPN's Ed Werder. "But more than anything,
(I got the) right ticket from him and his fiancée — Romo's wife-to-be. (It's) one of prettiest
invitations I've ever seen.

"So, yes, I will be there and (I'm) proud for him. He's got the best end of this deal."

Romo, who had been linked romantically before with Jessica Simpson and Carrie Underwood,
proposed to Crawford last December. Crawford's brother Chace is known for his role on the TV
show "Gossip Girl' and has also been linked romantically with Underwood.

According to the new Mrs. Romo, the lockout may play a part in the couple's plans for a
honeymoon; usually around this time of year, her husband would be participating in minicamps and
other off-season workouts.

"This lockout has been quite a dent in the honeymoon idea," she told WFAA-TV. "We'll see. We
haven't really gotten there yet. We're taking a day at a time with the lockout. We (are not)
even sure if we're gonna get to go (on) one."
"""


MEMORIAL = """\
Officially, Memorial Day, observed on the last Monday of May (this year it's May 30), honors the
war dead. Unofficially, the day honors the start of summer. (More on that in a moment.)

The upcoming three-day weekend has prompted searches on Yahoo! for "when is memorial day," "what
is memorial day," and "memorial day history." The day was originally known as "Decoration Day"
because the day was dedicated to the Civil War dead, when mourners would decorate gravesites as
a remembrance.

The holiday was first widely observed on May 30, 1868, when 5,000 people helped decorate the
gravesites of 20,000 Union and Confederate soldiers buried at Arlington National Cemetery. (Some
parts of the South still remember members of the Confederate Army with Confederate Memorial
Day.)

After World War I, the observances were widened to honor the fallen from all American wars--and
in 1971, Congress declared Memorial Day a national holiday.

Towns across the country now honor military personnel with services, parades, and fireworks. A
national moment of remembrance takes place at 3 p.m. At Arlington National Cemetery, headstones
are graced with small American flags.

This day is not to be confused with Veterans Day, which is observed on November 11 to honor
military veterans, both alive and dead.

However, confusion abounds anyway, with the weekend marking for many the kickoff of summer, and
it is reserved for weekend getaways, picnics, and sales. Searches on "memorial day sales,"
"memorial day recipes," and "memorial day weekend" are just some of the lookups related to the
festivities.
"""


SHINGLING_ARTICLE = """\
Finding duplicate files is easy, anyone can do it. Finding files that are almost identical is
more difficult, but it's useful for use cases like detecting plagiarism. In this article, I'll
present a simple python program that calculates the textual similarity of two documents.

The basic idea is to reduce each document to a set of strings and then use Jaccard similarity to
calculate the similarity of those sets. Of course, this wasn't my idea, I got it from chapter 3
of the free book Mining of Massive Datasets. You can find all the details and references to
original research there, I highly recommend it.

To reduce a document to a set of strings, we use a technique called shingling. Shingling
extracts the set of all substrings of length k (called k-shingles) from a text. This is
implemented by sliding a window of size k over the input document character by character and
throwing the substrings into a set. For example, the document "abcabcac" yields the 3-shingles
{"abc", "bca", "cab", "cac"}. There are more substrings of length k, but only four shingles
because the set eliminates duplicates.

Jaccard similarity is a simple measure for expressing similarity of sets. I first came across
this measure when studying recommender systems, but it keeps showing up in other machine
learning contexts, too. For sets A and B, it is defined as SIM(A, B) := |A ∩ B| / |A ∪ B|. The
result ranges from 0 (no elements in common) to 1 (identical). Obviously, plagiarized documents
have a higher similarity to the original than unrelated documents.
"""


NEAR_DUP_ARTICLE = """\
Most real-world duplication is not exact. Articles get paraphrased, headlines change, paragraphs
get reordered, and syndication services add or remove bylines and footers. To catch these
near-duplicates, you need a similarity measure that tolerates small differences.

The standard approach uses Jaccard similarity over sets of character n-grams. The appeal of this
approach is its simplicity and its direct connection to what we intuitively mean by "similar
content": two documents that share most of their character sequences are probably expressing
similar information, even if the exact wording differs.

Given a document $d$, you convert it to a set of overlapping character sequences of length $k$,
called k-shingles or k-grams. For example, with $k = 5$, the string "the cat sat" produces
shingles: {"the c", "he ca", "e cat", " cat ", "cat s", "at sa", "t sat"}.

The choice of character-level shingles rather than word-level n-grams is deliberate. Word-level
shingles are sensitive to tokenization choices and vocabulary differences across languages.
Character-level shingles are language-agnostic and naturally capture morphological variations
(for example, "running" and "runner" share most of their characters). They also gracefully
handle misspellings and OCR errors, where individual words may differ but most character
sequences remain shared.

Why convert a document to a set rather than a sequence? Because sets abstract away the positions
of shingles and focus entirely on their presence or absence. Two documents that express the same
ideas in different paragraph orders would have very different sequence representations, but
highly overlapping set representations. For deduplication, we care about content overlap, not
structural alignment, so sets are the right data model.
"""

# A paraphrase of ROMO's first three paragraphs, written so that no five consecutive words match.
ROMO_PARAPHRASE = """\
Two quarterbacks from rival NFC East clubs, Dallas's Tony Romo and Eli Manning of the Giants,
share one more thing: both hired one wedding planner, Todd Fiscus, to organise their marriages.
On Saturday Romo wed Candace Crawford, a former Miss Missouri, at Arlington Hall in Dallas, where
Fiscus served what he described as "man food". Pizza and short ribs were on the menu because,
Fiscus said, he had many football players to feed.

Romo reportedly chose all the music himself. According to Fiscus, Tony picked each song, decided
when each one plays and which moments mattered most.

Cowboys owner Jerry Jones was the open question. Because of the continuing lockout, owners must
not meet players away from the bargaining table, but the NFL gave Jones special dispensation to
attend the wedding, in the same way that Green Bay's Packers were told they will get their Super
Bowl rings at a June 16 ceremony regardless of the labor situation. Nearly all of Romo's
teammates were there with Jones.
"""

# A reference prefix distribution in the layout of service/data/prefix_reference.json: English
# first-letter mass of non-stopword terms, letters grouped into k classes of similar mass.
REFERENCE_DOC: dict[str, Any] = {
    "source": "test: English word frequencies, first letters, stopwords removed",
    "licence": "test data",
    "k8": {
        "k": 8,
        "classes": [
            {"prefixes": ["a", "o", "w"], "p": 0.12428},
            {"prefixes": ["b", "i", "l"], "p": 0.12939},
            {"prefixes": ["c", "h", "x", "z"], "p": 0.12063},
            {"prefixes": ["d", "m", "u", "y"], "p": 0.12659},
            {"prefixes": ["e", "j", "p"], "p": 0.12575},
            {"prefixes": ["f", "n", "r"], "p": 0.1294},
            {"prefixes": ["g", "k", "q", "t"], "p": 0.12227},
            {"prefixes": ["s", "v"], "p": 0.1217},
        ],
    },
    "k12": {
        "k": 12,
        "classes": [
            {"prefixes": ["a", "k", "x"], "p": 0.07463},
            {"prefixes": ["b", "h"], "p": 0.08495},
            {"prefixes": ["c"], "p": 0.0834},
            {"prefixes": ["d", "e"], "p": 0.08827},
            {"prefixes": ["f", "n"], "p": 0.07853},
            {"prefixes": ["g", "w"], "p": 0.08603},
            {"prefixes": ["i", "r"], "p": 0.07893},
            {"prefixes": ["j", "m", "u"], "p": 0.08248},
            {"prefixes": ["l", "o", "y"], "p": 0.08057},
            {"prefixes": ["p", "q"], "p": 0.07705},
            {"prefixes": ["s"], "p": 0.11045},
            {"prefixes": ["t", "v", "z"], "p": 0.07472},
        ],
    },
}

ALL_TEXTS = [FIG1_A, FIG1_B, ROMO, MEMORIAL, SHINGLING_ARTICLE, NEAR_DUP_ARTICLE, ROMO_PARAPHRASE]


@pytest.fixture(scope="module")
def reference() -> PrefixReference:
    return parse_prefix_reference(REFERENCE_DOC, 12)


def paragraphs(text: str) -> list[str]:
    return text.strip().split("\n\n")


def prefix_of_words(text: str, m: int) -> str:
    """The original text up to and including its m-th word (offsets from the tokenizer)."""
    return text[: int(tokenize(text).ends[m - 1])]


def distinct_chunks(text: str, n: int) -> int:
    return len(set(zip(*(words(text)[j:] for j in range(n)), strict=False)))


# --- chunk identity: the paper's Figure 1 ---------------------------------------------------------


def test_figure1_passages_are_the_highlighted_ones() -> None:
    """Figure 1 (left) highlights every shared run of >= 5 words; we find exactly those runs."""
    found = [" ".join(words(FIG1_A[p.a_start : p.a_end])) for p in matching_passages(FIG1_A, FIG1_B)]
    assert found == [
        "knowledge over search is obvious on the one hand but too simple on the other among others"
        " the question remains",
        "gain the maximum impact for automated",
        "it develops from the search plus simulation paradigm",
        "the roles of search and simulation",
    ]


def test_figure1_local_versus_global() -> None:
    """The same pair is locally weak but globally fairly similar: the paper's point."""
    shared_words = sum(len(words(FIG1_A[p.a_start : p.a_end])) for p in matching_passages(FIG1_A, FIG1_B))
    # 35 shared words lie in runs of >= 5 words, i.e. (run - 4) shared 5-word chunks per run.
    assert shared_words == 20 + 6 + 8 + 6
    inter = (20 - 4) + (6 - 4) + (8 - 4) + (6 - 4)
    na, nb = distinct_chunks(FIG1_A, 5), distinct_chunks(FIG1_B, 5)
    assert local_similarity(FIG1_A, FIG1_B, 5) == pytest.approx(inter / (na + nb - inter))
    assert chunk_containment(FIG1_A, FIG1_B, 5) == pytest.approx(inter / na)
    assert 0.5 < cosine_similarity(FIG1_A, FIG1_B) < 0.7
    # a shorter chunk finds more, a longer one less
    sims = [local_similarity(FIG1_A, FIG1_B, n) for n in range(3, 11)]
    assert sims == sorted(sims, reverse=True)


@pytest.mark.parametrize("n", range(3, 11))
@pytest.mark.parametrize(
    ("a", "b"),
    [(FIG1_A, FIG1_B), (ROMO, ROMO_PARAPHRASE), (SHINGLING_ARTICLE, NEAR_DUP_ARTICLE)],
)
def test_passage_offsets_slice_the_same_words(a: str, b: str, n: int) -> None:
    for p in matching_passages(a, b, n):
        wa, wb = words(a[p.a_start : p.a_end]), words(b[p.b_start : p.b_end])
        assert wa == wb
        assert len(wa) >= n
        # spans start and end on word boundaries of the originals
        assert re.match(r"\w", a[p.a_start]) and re.match(r"\w", a[p.a_end - 1])
        assert re.match(r"\w", b[p.b_start]) and re.match(r"\w", b[p.b_end - 1])


def test_passages_are_maximal_and_merged() -> None:
    """A shared run of L words is one passage, not L - n + 1 overlapping chunks."""
    a = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
    b = "one two three " + a.upper() + " four five"
    passages = matching_passages(a, b, 3)
    assert passages == [VerbatimPassage(0, len(a), len("one two three "), len("one two three ") + len(a))]


def test_repeated_phrase_gives_one_passage_per_alignment() -> None:
    a = "the quick brown fox jumps. later: the quick brown fox jumps again"
    b = "we saw the quick brown fox jumps"
    passages = matching_passages(a, b, 5)
    assert len(passages) == 2
    assert {a[p.a_start : p.a_end] for p in passages} == {"the quick brown fox jumps"}


# --- (a) a copy with a new intro and footer ---------------------------------------------------


@pytest.mark.parametrize("n", [3, 5, 8, 10])
def test_copy_with_new_intro_and_footer(n: int, reference: PrefixReference) -> None:
    intro, footer = paragraphs(MEMORIAL)[0], paragraphs(MEMORIAL)[-1]
    copy = f"{intro}\n\n{ROMO}\n\n{footer}"
    big_n, p, q = len(words(ROMO)), len(words(intro)), len(words(footer))
    # Every chunk of the original occurs in the copy; the copy adds p + q chunks of its own.
    assert chunk_containment(ROMO, copy, n) == 1.0
    expected = (big_n - n + 1) / (big_n + p + q - n + 1)
    assert local_similarity(ROMO, copy, n) == pytest.approx(expected, abs=0.005)
    assert 0.8 < local_similarity(ROMO, copy, n) < 0.9
    assert chunk_containment(copy, ROMO, n) == pytest.approx(expected, abs=0.005)
    # intro and footer (79 of 515 words) are nearly orthogonal to the story: cos ~ 1/sqrt(1+x^2)
    assert cosine_similarity(ROMO, copy) > 0.85
    passages = matching_passages(ROMO, copy, n)
    assert len(passages) == 1
    last_word_end = int(tokenize(ROMO).ends[-1])  # a passage ends on a word, not on '."'
    assert passages[0].a_start == 0 and passages[0].a_end == last_word_end
    assert copy[passages[0].b_start : passages[0].b_end] == ROMO[:last_word_end]


def test_copy_keeps_interior_fuzzy_chunks(reference: PrefixReference) -> None:
    """Content-defined chunk boundaries do not move when an intro is inserted: every chunk of the
    original except its first and last reappears word for word, hence with the same γ."""
    intro, footer = paragraphs(MEMORIAL)[0], paragraphs(MEMORIAL)[-1]
    copy = f"{intro}\n\n{ROMO}\n\n{footer}"
    params = FuzzyParams()
    gammas = fz.fuzzy_hashes_of_words(words(ROMO), reference, params)
    assert len(gammas) >= 3
    copy_gammas = set(fz.fuzzy_hashes_of_words(words(copy), reference, params).tolist())
    assert set(gammas[1:-1].tolist()) <= copy_gammas
    floor = (len(set(gammas.tolist())) - 2) / len(set(gammas.tolist()))
    assert fuzzy_containment(ROMO, copy, reference) >= floor
    assert fuzzy_similarity(ROMO, copy, reference) > 0.2


# --- (b) a copy truncated to 60 % ---------------------------------------------------------------


@pytest.mark.parametrize("n", range(3, 11))
def test_truncated_copy(n: int) -> None:
    big_n = len(words(ROMO))
    m = round(0.6 * big_n)
    truncated = prefix_of_words(ROMO, m)
    assert len(words(truncated)) == m
    assert chunk_containment(truncated, ROMO, n) == 1.0
    # h(T) ⊂ h(O), so local similarity is |h(T)| / |h(O)| = (m - n + 1) / (N - n + 1) for
    # chunks that are distinct within the story
    assert local_similarity(truncated, ROMO, n) == pytest.approx(
        distinct_chunks(truncated, n) / distinct_chunks(ROMO, n)
    )
    assert local_similarity(truncated, ROMO, n) == pytest.approx((m - n + 1) / (big_n - n + 1), abs=0.005)
    assert chunk_containment(ROMO, truncated, n) == pytest.approx(0.6, abs=0.01)
    assert matching_passages(truncated, ROMO, n) == [VerbatimPassage(0, len(truncated), 0, len(truncated))]


def test_truncated_copy_fuzzy(reference: PrefixReference) -> None:
    truncated = prefix_of_words(ROMO, round(0.6 * len(words(ROMO))))
    # all chunks of the truncated copy but its last are chunks of the original
    gammas = fz.fuzzy_hashes_of_words(words(truncated), reference)
    original = set(fz.fuzzy_hashes_of_words(words(ROMO), reference).tolist())
    assert set(gammas[:-1].tolist()) <= original
    assert fuzzy_containment(truncated, ROMO, reference) >= (len(gammas) - 1) / len(gammas)


# --- (c) a paraphrase -------------------------------------------------------------------------


def test_paraphrase_shares_no_chunk_but_is_globally_similar() -> None:
    source = "\n\n".join(paragraphs(ROMO)[:3])
    assert local_similarity(ROMO_PARAPHRASE, source, 5) == 0.0
    assert chunk_containment(ROMO_PARAPHRASE, source, 5) == 0.0
    assert matching_passages(ROMO_PARAPHRASE, source, 5) == []
    # same names, same facts, different wording
    assert cosine_similarity(ROMO_PARAPHRASE, source) > 0.5
    assert cosine_similarity(ROMO_PARAPHRASE, ROMO) > 0.4
    # against an unrelated story the paraphrase is globally dissimilar
    assert cosine_similarity(ROMO_PARAPHRASE, MEMORIAL) < 0.15


# --- (d) different texts on one topic ----------------------------------------------------------


def test_same_topic_texts_are_locally_dissimilar_globally_related() -> None:
    a, b = SHINGLING_ARTICLE, NEAR_DUP_ARTICLE
    assert local_similarity(a, b, 5) < 0.02
    assert chunk_containment(a, b, 5) < 0.05
    cos = cosine_similarity(a, b)
    assert 0.25 < cos < 0.65
    # a different topic is much further away globally
    assert cosine_similarity(a, ROMO) < cos / 4
    assert cosine_similarity(ROMO, MEMORIAL) < 0.15
    assert local_similarity(ROMO, MEMORIAL, 5) == 0.0


# --- edge cases ---------------------------------------------------------------------------------


@pytest.mark.parametrize("empty", ["", "   \n\t ", "--- !!! ...", "\x00\x07 \x1b"])
def test_empty_texts_have_defined_results(empty: str, reference: PrefixReference) -> None:
    assert chunk_fingerprint(empty).size == 0
    assert local_similarity(empty, empty) == 1.0  # two empty fingerprints are identical
    assert local_similarity(empty, ROMO) == 0.0
    assert chunk_containment(empty, ROMO) == 0.0
    assert chunk_containment(ROMO, empty) == 0.0
    assert matching_passages(empty, ROMO) == []
    assert matching_passages(empty, empty) == []
    assert fuzzy_fingerprint(empty, reference).size == 0
    assert fuzzy_similarity(empty, ROMO, reference) == 0.0
    assert cosine_similarity(empty, ROMO) == 0.0
    assert cosine_similarity(empty, empty) == 1.0


def test_texts_shorter_than_a_chunk() -> None:
    """A text of fewer than n words is one chunk of all its words, so it still has a fingerprint."""
    assert chunk_fingerprint("Breaking news", 5).size == 1
    assert local_similarity("Breaking news!", "breaking NEWS", 5) == 1.0
    assert local_similarity("Breaking news", "Breaking news tonight", 5) == 0.0
    assert chunk_containment("Breaking news", ROMO, 5) == 0.0
    assert matching_passages("Breaking news!", "... breaking NEWS", 5) == [VerbatimPassage(0, 13, 4, 17)]
    assert matching_passages("Breaking news", ROMO, 5) == []


def test_chunk_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk size"):
        chunk_fingerprint(ROMO, 0)
    with pytest.raises(ValueError, match="chunk size"):
        matching_passages(ROMO, ROMO, 0)


def test_chunk_digests_ignore_case_and_punctuation_only() -> None:
    a = chunk_hashes(words("The COWBOYS' owner, Jerry Jones, attended."), 3)
    b = chunk_hashes(words("the cowboys owner -- jerry jones attended"), 3)
    c = chunk_hashes(words("the cowboy owner jerry jones attended"), 3)
    assert np.array_equal(a, b)  # a trailing apostrophe is punctuation, not part of the word
    assert np.array_equal(a[2:], c[2:]) and not np.array_equal(a[:2], c[:2])
    # inner apostrophes belong to the word, typographic or not
    assert words("Romo’s ROMO's romos") == ["romo's", "romo's", "romos"]
    # order matters: a chunk is a sequence
    assert chunk_hashes(["a", "b", "c"], 3)[0] != chunk_hashes(["c", "b", "a"], 3)[0]


def test_fingerprint_is_sorted_set_of_distinct_digests() -> None:
    fp = fingerprint_of_words(words(ROMO), 5)
    assert fp.dtype == np.uint64
    assert np.all(np.diff(fp.astype(object)) > 0) if fp.size > 1 else True
    assert fp.size == distinct_chunks(ROMO, 5)


def test_word_passages_merge_touching_chunks() -> None:
    ha = np.array([1, 2, 9, 8, 3], dtype=np.uint64)  # chunks 0, 1 and 4 match
    hb = np.array([1, 2, 7, 6, 3], dtype=np.uint64)
    # n = 2: chunks 0-1 cover words 0..2, chunk 4 covers words 4..5, word 3 is unmatched
    assert word_passages(ha, hb, 2) == [(0, 3, 0, 3), (4, 6, 4, 6)]
    # n = 3: chunks 0-1 cover words 0..3 and chunk 4 words 4..6, touching: one passage
    assert word_passages(ha, hb, 3) == [(0, 7, 0, 7)]
    # another alignment (diagonal) is another passage
    assert word_passages(np.array([5, 6], dtype=np.uint64), np.array([0, 5, 6], dtype=np.uint64), 2) == [
        (0, 3, 1, 4)
    ]


# --- fuzzy-fingerprints -------------------------------------------------------------------------


@pytest.mark.parametrize("k", [8, 12])
@pytest.mark.parametrize("thresholds", [(0.0,), (-0.5, 0.5), (-0.6, 0.0, 0.6), (-0.8, -0.3, 0.3, 0.8)])
def test_fuzzy_gamma_in_range(k: int, thresholds: tuple[float, ...]) -> None:
    ref = parse_prefix_reference(REFERENCE_DOC, k)
    params = FuzzyParams(chunk_words=40, thresholds=thresholds)
    r = len(thresholds) + 1
    for text in ALL_TEXTS:
        gammas = fz.fuzzy_hashes_of_words(words(text), ref, params)
        assert gammas.size > 0
        assert int(gammas.max()) < r**k
        assert int(gammas.min()) >= 0


def test_fuzzy_gamma_follows_the_definition(reference: PrefixReference) -> None:
    """γ = Σ δ_i r^i with δ_i the interval of (pf_i - p_i) / p_i, recomputed by hand."""
    params = FuzzyParams(chunk_words=100, thresholds=(-0.5, 0.5))
    seq = words(ROMO)
    bounds = fz.chunk_bounds(seq, params.chunk_words)
    expected = np.array([c.p for c in reference.classes])
    expected /= expected.sum()
    gammas = []
    for start, end in bounds:
        counts = [0] * reference.k
        for w in seq[start:end]:
            if w in STOPWORDS:
                continue
            for i, cls in enumerate(reference.classes):
                if w.startswith(cls.prefixes):
                    counts[i] += 1
        total = sum(counts)
        gamma = 0
        for i, count in enumerate(counts):
            dev = (count / total - expected[i]) / expected[i]
            delta = 0 if dev <= -0.5 else (1 if dev <= 0.5 else 2)
            gamma += delta * 3**i
        gammas.append(gamma)
    assert fz.fuzzy_hashes_of_words(seq, reference, params).tolist() == gammas


@pytest.mark.parametrize("chunk_words", [10, 50, 100])
def test_chunks_cover_the_document_without_overlap(chunk_words: int) -> None:
    for text in ALL_TEXTS:
        seq = words(text)
        bounds = fz.chunk_bounds(seq, chunk_words)
        assert bounds[0][0] == 0 and bounds[-1][1] == len(seq)
        assert all(e1 == s2 for (_, e1), (s2, _) in itertools.pairwise(bounds))
        if len(seq) > chunk_words:
            assert all(chunk_words // 4 <= e - s <= 3 * chunk_words for s, e in bounds)
    assert fz.chunk_bounds([], 100) == []
    assert fz.chunk_bounds(["one", "word"], 100) == [(0, 2)]


def test_content_chunks_average_about_chunk_words() -> None:
    seq = words(" ".join([ROMO, MEMORIAL, SHINGLING_ARTICLE, NEAR_DUP_ARTICLE] * 3))
    bounds = fz.chunk_bounds(seq, 50)
    mean = len(seq) / len(bounds)
    assert 30 < mean < 80


def test_fuzzy_identical_and_near_identical(reference: PrefixReference) -> None:
    assert fuzzy_similarity(ROMO, ROMO, reference) == 1.0
    # re-punctuated, re-cased, re-wrapped: the same words, the same fingerprint
    messy = " ".join(ROMO.upper().replace(",", " ;").split())
    assert np.array_equal(fuzzy_fingerprint(messy, reference), fuzzy_fingerprint(ROMO, reference))


def test_fuzzy_params_validation() -> None:
    with pytest.raises(ValueError, match="ascending"):
        FuzzyParams(thresholds=(0.5, -0.5))
    with pytest.raises(ValueError, match="chunk_words"):
        FuzzyParams(chunk_words=2)
    assert FuzzyParams(thresholds=(-0.5, 0.0, 0.5)).r == 4
    wide = PrefixReference(tuple(PrefixClass((chr(97 + i),), 1.0) for i in range(26)))
    with pytest.raises(ValueError, match="64 bits"):
        fz.fuzzy_hashes_of_words(words(ROMO), wide, FuzzyParams(thresholds=tuple(range(9))))


# --- the reference distribution -----------------------------------------------------------------


def test_reference_parsing_layouts() -> None:
    ref = parse_prefix_reference(REFERENCE_DOC, 8)
    assert ref.k == 8
    assert ref.expected.sum() == pytest.approx(1.0)
    assert ref.class_of("search") == ref.class_of("vote") == 7
    assert ref.class_of("1868") == -1
    # default k: DEFAULT_K when offered
    assert parse_prefix_reference(REFERENCE_DOC).k == fz.DEFAULT_K
    # nested one level down, lone entry, and classes as a prefix -> p mapping
    assert parse_prefix_reference({"references": REFERENCE_DOC}, 8).classes == ref.classes
    assert parse_prefix_reference(REFERENCE_DOC["k8"]).classes == ref.classes
    mapping = {"k": 2, "classes": {"a|b": 0.5, "c": 0.5}}
    two = parse_prefix_reference(mapping)
    assert two.classes == (PrefixClass(("a", "b"), 0.5), PrefixClass(("c",), 0.5))
    alt = {
        "k3": {
            "classes": [
                {"prefix": "a", "prob": 1},
                {"prefix": "b", "prob": 1},
                {"prefix": "c", "prob": 2},
            ]
        }
    }
    assert parse_prefix_reference(alt).expected.tolist() == [0.25, 0.25, 0.5]


def test_reference_longest_prefix_wins() -> None:
    ref = PrefixReference((PrefixClass(("s",), 0.5), PrefixClass(("st", "sh"), 0.5)))
    assert ref.class_of("story") == 1
    assert ref.class_of("sport") == 0
    assert ref.class_of("x") == -1


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"source": "nothing"}, "no entry"),
        ({"k8": {"k": 8, "classes": [{"prefixes": ["a"], "p": 1.0}]}}, "has 1 classes"),
        (
            {"k": 2, "classes": [{"prefixes": ["a"], "p": 0.5}, {"prefixes": ["a"], "p": 0.5}]},
            "'a' in classes 0 and 1",
        ),
        (
            {"k": 2, "classes": [{"prefixes": ["a"], "p": 0.0}, {"prefixes": ["b"], "p": 1.0}]},
            "p=0.0",
        ),
        ({"k": 1, "classes": [{"prefixes": ["a"]}]}, "probability"),
        ({"k": 1, "classes": [{"p": 1.0}]}, "prefixes"),
    ],
)
def test_reference_errors_name_the_problem(doc: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_prefix_reference(doc)


def test_reference_missing_k_lists_available() -> None:
    with pytest.raises(ValueError, match=r"no k=16 \(available: \[8, 12\]\)"):
        parse_prefix_reference(REFERENCE_DOC, 16)


def test_load_prefix_reference_from_file(tmp_path: Path) -> None:
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(REFERENCE_DOC), encoding="utf-8")
    assert load_prefix_reference(path, 12) == parse_prefix_reference(REFERENCE_DOC, 12)


@pytest.mark.skipif(not REFERENCE_PATH.exists(), reason="shipped prefix reference not built yet")
def test_shipped_reference_loads() -> None:
    ref = load_prefix_reference()
    assert ref.k >= 2
    assert ref.expected.sum() == pytest.approx(1.0)
    # most index terms of news prose fall into some class
    ids = fz.class_ids(words(ROMO), ref)
    content = [w for w in words(ROMO) if w not in STOPWORDS]
    assert np.count_nonzero(ids >= 0) >= 0.9 * len(content)


# --- stemming and cosine ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("caresses", "caress"),
        ("ponies", "poni"),
        ("cats", "cat"),
        ("caress", "caress"),
        ("agreed", "agree"),
        ("feed", "feed"),
        ("plastered", "plaster"),
        ("motoring", "motor"),
        ("sing", "sing"),
        ("conflated", "conflate"),
        ("troubled", "trouble"),
        ("sized", "size"),
        ("hopping", "hop"),
        ("falling", "fall"),
        ("hissing", "hiss"),
        ("failing", "fail"),
        ("filing", "file"),
        ("happy", "happi"),
        ("sky", "sky"),
        ("status", "status"),
        ("quarterbacks", "quarterback"),
        ("searches", "search"),
        ("honors", "honor"),
        ("at", "at"),
        ("1868", "1868"),
    ],
)
def test_stem(word: str, expected: str) -> None:
    assert stem(word) == expected


def test_stopwords_are_removed_from_term_vectors() -> None:
    assert 140 <= len(STOPWORDS) <= 200
    vec = term_vector("The searches and the searched: it is what it is.")
    assert vec == {"search": 2}


def test_cosine_properties() -> None:
    assert cosine_similarity(ROMO, ROMO) == 1.0
    assert cosine_similarity(ROMO, MEMORIAL) == pytest.approx(cosine_similarity(MEMORIAL, ROMO))
    # word order is invisible to the global measure
    shuffled = " ".join(sorted(words(ROMO)))
    assert cosine_similarity(ROMO, shuffled) == pytest.approx(1.0)
    assert local_similarity(ROMO, shuffled, 5) < 0.05
    # inflection is stemmed away
    assert cosine_similarity("The searches honored soldiers", "search honor soldier") == 1.0


def test_compare_local_agrees_with_the_single_measures(reference: PrefixReference) -> None:
    cmp = compare_local(FIG1_A, FIG1_B, 5, reference)
    assert cmp.local == local_similarity(FIG1_A, FIG1_B, 5)
    assert cmp.containment_ab == chunk_containment(FIG1_A, FIG1_B, 5)
    assert cmp.containment_ba == chunk_containment(FIG1_B, FIG1_A, 5)
    assert cmp.cosine == cosine_similarity(FIG1_A, FIG1_B)
    assert cmp.fuzzy == fuzzy_similarity(FIG1_A, FIG1_B, reference)
    assert list(cmp.passages) == matching_passages(FIG1_A, FIG1_B, 5)
    assert compare_local(FIG1_A, FIG1_B).fuzzy is None


# --- the terminal report ------------------------------------------------------------------------


def test_report_plain_marks_passages(reference: PrefixReference) -> None:
    out = render_compare_local(FIG1_A, FIG1_B, color=False, width=100, reference=reference)
    assert "\x1b" not in out
    assert "local, chunk identity (n=5 words)" in out
    assert f"{local_similarity(FIG1_A, FIG1_B, 5):.3f}" in out
    assert f"{cosine_similarity(FIG1_A, FIG1_B):.3f}" in out
    assert f"{fuzzy_similarity(FIG1_A, FIG1_B, reference):.3f}" in out
    assert "shared passages of >= 5 words: 4" in out
    assert all(len(line) <= 100 for line in out.splitlines())
    # both columns, each passage once per side
    body = out.split("-+-", 1)[1]
    left = " ".join(line.split(" | ")[0] for line in body.splitlines()[1:])
    right = " ".join(line.split(" | ", 1)[1] for line in body.splitlines()[1:] if " | " in line)
    marked_left = re.findall(r"\[\[(.*?)\]\]", left)
    marked_right = re.findall(r"\[\[(.*?)\]\]", right)
    assert [words(s) for s in marked_left] == [
        words(FIG1_A[p.a_start : p.a_end]) for p in matching_passages(FIG1_A, FIG1_B)
    ]
    assert len(marked_right) == 4
    assert "gain the maximum impact for automated" in marked_right


def test_report_colour_uses_ansi_not_markers(reference: PrefixReference) -> None:
    out = render_compare_local(FIG1_A, FIG1_B, color=True, width=90, reference=reference)
    assert "\x1b[" in out
    assert "[[" not in out
    visible = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert all(len(line) <= 90 for line in visible.splitlines())
    assert "│" in visible


def test_report_chunk_size_and_no_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    import neardup.local_similarity.report as report

    monkeypatch.setattr(report, "default_prefix_reference", lambda k=None: None)
    out = render_compare_local(ROMO, ROMO_PARAPHRASE, chunk_words=3, color=False, width=80)
    assert "local, chunk identity (n=3 words)" in out
    assert "fuzzy-fingerprint (no prefix reference)" in out
    assert "n/a" in out


def test_report_handles_empty_and_hostile_text(reference: PrefixReference) -> None:
    out = render_compare_local("", "", color=False, width=60, reference=reference)
    assert "shared passages of >= 5 words: 0" in out
    hostile = "Breaking \x1b[2J news\x07 " + "x" * 150  # escapes, bell, an over-long word
    out = render_compare_local(hostile, hostile, color=True, width=60, reference=reference)
    assert "\x1b[2J" not in out and "\x07" not in out
    visible = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert all(len(line) <= 60 for line in visible.splitlines())


def test_highly_repetitive_text_aligns_by_occurrence() -> None:
    """Chunks repeated hundreds of times must not pair quadratically, yet copies still align."""
    ruler = "a b " * 5000
    assert matching_passages(ruler, ruler, 3) == [VerbatimPassage(0, len(ruler) - 1, 0, len(ruler) - 1)]
    shifted = "new intro here " + ruler
    (p,) = matching_passages(shifted, ruler, 3)
    assert shifted[p.a_start : p.a_end] == ruler[p.b_start : p.b_end] == ruler.rstrip()


def _columns_of(out: str, width: int) -> tuple[str, str]:
    """The left and right column text of a report, markers and colours removed."""
    col = (width - 3) // 2
    visible = re.sub(r"\x1b\[[0-9;]*m", "", out)
    body = visible.split("\n")
    start = next(i for i, line in enumerate(body) if set(line) <= {"-", "+", "─", "┼"} and line)
    left = " ".join(line[:col] for line in body[start + 1 :])
    right = " ".join(line[col + 3 :] for line in body[start + 1 :])
    return left.replace("[[", "").replace("]]", ""), right.replace("[[", "").replace("]]", "")


@pytest.mark.parametrize("color", [False, True])
@pytest.mark.parametrize("width", [60, 101])
def test_report_columns_hold_the_whole_texts(color: bool, width: int, reference: PrefixReference) -> None:
    """Every word of both multi-paragraph texts appears in its column, in order, nothing else."""
    intro, footer = paragraphs(MEMORIAL)[0], paragraphs(MEMORIAL)[-1]
    b = f"{intro}\n\n{prefix_of_words(ROMO, 200)}\n\n{footer}"
    out = render_compare_local(ROMO, b, color=color, width=width, reference=reference)
    left, right = _columns_of(out, width)
    assert words(left) == words(ROMO)
    assert words(right) == words(b)
    assert "shared passages of >= 5 words: 1" in out


# --- the verdicts the engine gives the four known cases -------------------------------------------


def _verdict(original: str, copy: str) -> tuple[str, float, float]:
    """Index `original`, then decide about `copy` with the default parameters."""
    from neardup.core.params import DedupParams
    from neardup.pipeline.shard import IndexShard
    from neardup.state.memory import MemoryState
    from tests.support.shard import process

    engine = IndexShard(MemoryState(), DedupParams())
    process(engine, "original", original)
    decision = process(engine, "copy", copy).decision
    exact = exact_jaccard(shingle_set(normalize(original)), shingle_set(normalize(copy)))
    covered = exact_containment(shingle_set(normalize(original)), shingle_set(normalize(copy)))
    return decision.kind, exact, covered


def test_verdict_copy_with_intro_and_footer_is_a_duplicate() -> None:
    intro, footer = paragraphs(MEMORIAL)[0], paragraphs(MEMORIAL)[-1]
    kind, exact, covered = _verdict(ROMO, f"{intro}\n\n{ROMO}\n\n{footer}")
    assert exact > 0.85 and covered == 1.0
    assert kind == "duplicate"


def test_verdict_copy_wrapped_in_much_new_text_is_partial() -> None:
    """Jaccard falls well below the threshold, but the whole original is inside the copy."""
    wrapper = paragraphs(MEMORIAL)
    copy = "\n\n".join([*wrapper[:3], ROMO, *wrapper[3:]])
    kind, exact, covered = _verdict(ROMO, copy)
    assert exact < 0.75 and covered == 1.0
    assert kind == "partial"


def test_verdict_truncated_copy_is_partial() -> None:
    truncated = prefix_of_words(ROMO, round(0.6 * len(words(ROMO))))
    kind, exact, _ = _verdict(ROMO, truncated)
    assert 0.55 < exact < 0.7
    assert kind == "partial"


def test_verdict_paraphrase_is_unique() -> None:
    kind, exact, _ = _verdict("\n\n".join(paragraphs(ROMO)[:3]), ROMO_PARAPHRASE)
    assert exact < 0.4
    assert kind == "unique"


def test_verdict_same_topic_different_text_is_unique() -> None:
    kind, exact, _ = _verdict(SHINGLING_ARTICLE, NEAR_DUP_ARTICLE)
    assert exact < 0.2
    assert kind == "unique"
