"""Stage 2, "index": what the decision is made of and what it leaves. Exact-content fast path → LSH
candidates → verification → verdict, made a batch at a time in compiled code (_sketch.decide_fresh,
its comment says how; IndexShard runs it) with the figures `fresh_settings` gives. Here: the
verdict's and the indexed article's types, the ports a decision reads through, and the scoring
of one pair (`score`, for `neardup evaluate`). The same rule written one article at a time in
Python, the reference the compiled run is tested on, is tests/support/reference_decide.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from .anchors import PASSAGE_SETTINGS, Anchors, Passage
from .minhash import (
    CHANCE_AGREEMENT,
    EMPTY_VERIFIER_SLOT,
    VerifierArray,
    estimate_containment,
)
from .params import DedupParams
from .signing import Sketch

VerdictKind = Literal["unique", "duplicate", "partial", "revised"]
PASSAGES = 3  # shared passages a verdict names at most
# Anchor candidates a decision weighs, the most shared first: the text an article reuses most is
# among them, and a story of many related articles does not make each decision weigh them all.
ANCHOR_CANDIDATES = 4


@dataclass(frozen=True)
class Candidate:
    """An earlier article the LSH index proposed, with its verified scores."""

    article_id: str
    jaccard: float
    containment: float  # share of the new article found in the candidate
    contains: float  # share of the candidate found in the new article


@dataclass(frozen=True)
class Decision:
    """What was decided about one article version; stored with it so re-delivery repeats it."""

    kind: VerdictKind
    match_id: str | None
    jaccard: float | None
    containment: float | None
    contains: float | None
    canonical_id: str
    exact: bool
    candidates: tuple[Candidate, ...]
    # partial and revised: where the match's text lies in this one, longest first (offsets in the
    # canonical texts, at the anchors' resolution)
    passages: tuple[Passage, ...] = ()


@dataclass(frozen=True, eq=False)
class IndexedArticle:
    """One indexed article version: its sketch, its order of arrival, its decision, the band
    keys it was indexed under (so that it can be taken out again without its signature), its event
    time (what retention compares), and its cluster: the arrival number and id of the cluster's
    first article (-1 and "": the article is its own)."""

    article_id: str
    version: int
    seq: int
    sketch: Sketch
    decision: Decision
    keys: tuple[bytes, ...] = ()
    time_ms: int = 0
    cluster: int = -1
    cluster_id: str = ""

    def __post_init__(self) -> None:
        if self.cluster < 0:
            object.__setattr__(self, "cluster", self.seq)
            object.__setattr__(self, "cluster_id", self.article_id)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, IndexedArticle)
            and (self.article_id, self.version, self.seq, self.decision, self.keys, self.time_ms)
            == (other.article_id, other.version, other.seq, other.decision, other.keys, other.time_ms)
            and (self.cluster, self.cluster_id) == (other.cluster, other.cluster_id)
            and _same_sketches(self.sketch, other.sketch)
        )

    # An indexed article is its own Prospect (below).
    @property
    def shingle_count(self) -> int:
        return self.sketch.shingle_count

    @property
    def verifier(self) -> VerifierArray:
        return self.sketch.verifier

    @property
    def anchors(self) -> Anchors:
        return self.sketch.anchors

    @property
    def anchor_count(self) -> int:
        return self.sketch.anchors.distinct_count

    @property
    def in_postings(self) -> bool:
        """Whether its anchors index it: not a duplicate, whose match holds the same text and
        stands for it (a hot story's copies would fill every posting list of its anchors)."""
        return self.decision.kind != "duplicate"

    __hash__ = None  # type: ignore[assignment]


def _same_sketches(a: Sketch, b: Sketch) -> bool:
    """Sketches equal as an indexed article keeps them: where there is a verifier, the record
    keeps no signature (band keys and verifier serve instead), so signatures are not compared
    (nor anchors)."""
    if a.verifier.size and b.verifier.size:
        return replace(a, signature=b.signature, anchors=b.anchors) == b
    return a == b


@dataclass(frozen=True)
class IndexUpdate:
    """State changes for one article: put `article` (indexed under its keys); drop `replaced`;
    `revived`: the id was deleted before, its deletion marker goes."""

    article: IndexedArticle
    replaced: IndexedArticle | None
    revived: bool = False


class Prospect(Protocol):
    """A candidate as verification reads it: what scoring it takes (its verifier and distinct
    count), its arrival for ties, and its cluster for the verdict. An
    IndexedArticle is one; a store may hand out lighter ones that decode the rest of a record (the
    sketch, read only where verifiers cannot be compared, or there are none) when asked: tens of
    candidates per article, most of them never the match."""

    @property
    def article_id(self) -> str: ...

    @property
    def seq(self) -> int: ...

    @property
    def shingle_count(self) -> int: ...

    @property
    def verifier(self) -> VerifierArray | bytes: ...

    @property
    def cluster(self) -> int: ...

    @property
    def cluster_id(self) -> str: ...

    @property
    def time_ms(self) -> int: ...

    @property
    def sketch(self) -> Sketch: ...

    @property
    def anchors(self) -> Anchors: ...

    @property
    def anchor_count(self) -> int:
        """Its distinct anchors (the record keeps them distinct but for a repeated passage)."""


class StateReader(Protocol):
    """What the decision needs to read. Adapters: memory and RocksDB (service/state)."""

    def get(self, article_id: str) -> IndexedArticle | None: ...

    def holder_of(self, content_hash: bytes) -> IndexedArticle | None:
        """The indexed article that stands for this content (the earliest one still held)."""

    def head_of(self, cluster: int) -> str | None:
        """The id of the cluster's earliest surviving article when its first one is gone (deleted,
        expired or replaced); None while the first one is held."""

    def candidates(self, keys: Sequence[bytes], exclude: str, limit: int) -> Sequence[Prospect]:
        """The distinct articles in the band buckets `keys`, but `exclude`, in order of first
        appearance (bucket by bucket, each in the order its articles joined it), at most `limit`."""

    def anchor_candidates(self, anchors: Anchors, exclude: str, limit: int) -> Sequence[tuple[Prospect, int]]:
        """The articles that share anchors with `anchors` (two, or all of the fewer either side
        has), with how many, but `exclude`, the most shared first, at most `limit`; anchors held
        by a full posting list (boilerplate) propose none."""

    def next_seq(self) -> int: ...

    def deleted_version(self, article_id: str) -> int | None:
        """The last version of a deleted id while its marker lasts; None: not deleted (or expired)."""


def score(sketch: Sketch, other: Sketch, other_id: str) -> Candidate:
    """Verify a candidate by estimated Jaccard (on the verifiers: 512 slots by default, where LSH has
    128; on the signatures with the verifier off) and the containment estimates derived from it."""
    jaccard = sketch.estimate_jaccard(other)
    inside, contains = estimate_containment(jaccard, sketch.shingle_count, other.shingle_count)
    return Candidate(other_id, jaccard, inside, contains)


def fresh_settings(params: DedupParams) -> tuple[float | int | bool, ...]:
    """The rule's figures as the compiled run takes them (_sketch.decide_fresh, after the state's
    two caps), the same that the reference decision reads from `params`."""
    partial, revised = params.containment_threshold, params.revised_threshold
    counts = (params.max_candidates, params.top_candidates, ANCHOR_CANDIDATES, PASSAGES)
    thresholds = (
        params.threshold,
        -1.0 if partial is None else partial,
        -1.0 if revised is None else revised,
    )
    return (
        *counts,
        *thresholds,
        bool(partial or revised),
        EMPTY_VERIFIER_SLOT,
        CHANCE_AGREEMENT,
        *PASSAGE_SETTINGS,
    )
