"""Stage 2, "index": the decision. Exact-content fast path → LSH candidates → verification → verdict.

`decide` only reads state through the `StateReader` port and returns the verdict together with the
update to apply; applying it (atomically) is the caller's job. That keeps the rule testable without
storage and identical in the embedded mode and the stream.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple, Protocol

from .anchors import PASSAGE_SETTINGS, Anchors, Passage, passages
from .compiled import _sketch
from .lsh import band_keys
from .minhash import (
    CHANCE_AGREEMENT,
    EMPTY_VERIFIER_SLOT,
    VerifierArray,
    estimate_containment,
    verified_scores,
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


@dataclass(frozen=True)
class Outcome:
    """The verdict-worthy result of one article: its record, and the update (None on re-delivery)."""

    article: IndexedArticle
    update: IndexUpdate | None

    @property
    def redelivered(self) -> bool:
        return self.update is None


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


def decide(
    article_id: str,
    sketch: Sketch,
    state: StateReader,
    params: DedupParams,
    keys: Sequence[bytes] | None = None,
    time_ms: int = 0,
    not_before_ms: int | None = None,
) -> Outcome:
    """Decide about one article; never names the article itself as its own duplicate. `keys`: the
    article's band keys when the caller has them (band_keys of its signature), else computed here.
    `time_ms`: its event time, stored for retention; `not_before_ms`: the retention cutoff, before
    which an article is never a match even while it waits for the next expiry pass."""
    existing = state.get(article_id)
    if existing is not None and existing.sketch.content_hash == sketch.content_hash:
        return Outcome(existing, None)

    keys = tuple(band_keys(sketch.signature, params.lsh.bands, params.lsh.rows) if keys is None else keys)
    # a re-added id continues its versions: (id, version) never names two articles
    last = existing.version if existing is not None else state.deleted_version(article_id)
    version, seq = 0 if last is None else last + 1, state.next_seq()
    not_before = -math.inf if not_before_ms is None else not_before_ms
    decision, cluster, cluster_id = _exact_match(article_id, sketch, state, not_before) or _verified_match(
        article_id, seq, sketch, keys, state, params, not_before
    )
    article = IndexedArticle(article_id, version, seq, sketch, decision, keys, time_ms, cluster, cluster_id)
    return Outcome(article, IndexUpdate(article, existing, revived=existing is None and last is not None))


Matched = tuple[Decision, int, str]  # the decision, and the cluster it puts the article in


def _exact_match(article_id: str, sketch: Sketch, state: StateReader, not_before: float) -> Matched | None:
    first = state.holder_of(sketch.content_hash)
    if first is None or first.article_id == article_id or first.time_ms < not_before:
        return None
    match = Candidate(first.article_id, 1.0, 1.0, 1.0)
    return _matched(state, sketch, "duplicate", first, (1.0, 1.0, 1.0), (match,), exact=True)


def score(sketch: Sketch, other: Sketch, other_id: str) -> Candidate:
    """Verify a candidate by estimated Jaccard (on the verifiers: 512 slots by default, where LSH has
    128; on the signatures with the verifier off) and the containment estimates derived from it."""
    jaccard = sketch.estimate_jaccard(other)
    inside, contains = estimate_containment(jaccard, sketch.shingle_count, other.shingle_count)
    return Candidate(other_id, jaccard, inside, contains)


class Ranked(NamedTuple):
    """An article's candidates ranked: `top`, the best first (the higher Jaccard, then the earlier
    arrival), as (index in the candidates, jaccard, containment, contains); `match`, the one the
    verdict names, as (kind, index, jaccard, containment, contains), or None (unique)."""

    top: list[tuple[int, float, float, float]]
    match: tuple[VerdictKind, int, float, float, float] | None


def rank(sketch: Sketch, others: Sequence[Prospect], params: DedupParams) -> Ranked:
    """The decision over the candidates in one compiled pass (_sketch.rank) on the verifiers; where
    there is none (verify_perm=0) or a candidate's differs in length from the article's (state
    written with other settings), each scored by itself from the sketches (score, on their
    signatures) and ranked by _ranked, with the same rule."""
    if sketch.verifier.size:
        try:
            top, match = _sketch.rank(
                sketch.verifier,
                others,
                sketch.shingle_count,
                EMPTY_VERIFIER_SLOT,
                CHANCE_AGREEMENT,
                params.top_candidates,
                params.threshold,
                -1.0 if params.containment_threshold is None else params.containment_threshold,
            )
            return Ranked(top, None if match is None else (_KINDS[match[0]], *match[1:]))
        except ValueError:  # a verifier's length differs: scored from the sketches
            pass
    return _ranked(others, params, [score(sketch, other.sketch, other.article_id) for other in others])


_KINDS: dict[int, VerdictKind] = {1: "duplicate", 2: "partial"}  # _sketch.rank's match kinds


def _ranked(others: Sequence[Prospect], params: DedupParams, scored: Sequence[Candidate]) -> Ranked:
    """rank from each candidate's scores: the rule _sketch.rank applies, and its reference in the
    tests."""
    figures = [(float(c.jaccard), float(c.containment), float(c.contains)) for c in scored]
    # Best first; among equals the earliest arrival, so the verdict does not depend on band order.
    order = sorted(range(len(figures)), key=lambda i: (-figures[i][0], others[i].seq))
    top = [(i, *figures[i]) for i in order[: params.top_candidates]]
    best = order[0]
    if figures[best][0] >= params.threshold:  # the best is a duplicate whenever any is
        return Ranked(top, ("duplicate", best, *figures[best]))
    reach = [max(inside, contains) for _, inside, contains in figures]
    partial = params.containment_threshold
    if partial is not None and (partials := [i for i, r in enumerate(reach) if r >= partial]):
        pick = min(partials, key=lambda i: (-reach[i], others[i].seq))
        return Ranked(top, ("partial", pick, *figures[pick]))
    return Ranked(top, None)


def _verified_match(
    article_id: str,
    seq: int,
    sketch: Sketch,
    keys: Sequence[bytes],
    state: StateReader,
    params: DedupParams,
    not_before: float,
) -> Matched:
    proposed = state.candidates(keys, article_id, params.max_candidates)
    others = [other for other in proposed if other.time_ms >= not_before]
    top, match = rank(sketch, others, params) if others else ([], None)
    # Candidate objects only for what the decision keeps (a news cluster gives tens of candidates).
    kept = tuple(Candidate(others[i].article_id, j, a, b) for i, j, a, b in top)
    if match is not None and match[0] == "duplicate":
        # a duplicate is the strongest verdict, and joins no posting list: no anchor lookup
        return _matched(state, sketch, "duplicate", others[match[1]], match[2:], kept)
    anchored: list[tuple[Prospect, int]] = []
    if len(sketch.anchors) and (params.containment_threshold or params.revised_threshold):
        sharing = state.anchor_candidates(sketch.anchors, article_id, ANCHOR_CANDIDATES)
        anchored = [(other, shared) for other, shared in sharing if other.time_ms >= not_before]
    contained = _contained(sketch, anchored, params)
    if match is not None and (contained is None or contained[1] != "partial"):
        # a partial by the verifier: the anchors show where
        return _matched(state, sketch, "partial", others[match[1]], match[2:], kept)
    if contained is None:
        return Decision("unique", None, None, None, None, article_id, False, kept), seq, article_id
    other, kind, inside, contains = contained
    # the Jaccard estimate for this one candidate: the verifiers', or the signatures' without them
    scored = verified_scores(sketch.verifier, sketch.shingle_count, [other])
    jaccard = float(scored[0][0]) if scored is not None else sketch.estimate_jaccard(other.sketch)
    if not any(c.article_id == other.article_id for c in kept):
        kept += (Candidate(other.article_id, jaccard, inside, contains),)
    return _matched(state, sketch, kind, other, (jaccard, inside, contains), kept)


def _matched(
    state: StateReader,
    sketch: Sketch,
    kind: VerdictKind,
    other: Prospect,
    scores: tuple[float, float, float],
    kept: tuple[Candidate, ...],
    exact: bool = False,
) -> Matched:
    """The verdict naming `other`, which puts the article in `other`'s cluster. Its canonical
    article is the cluster's first, or when that one is gone, the earliest member still held (the
    cluster is handed on, never lost with its first article). A partial or revised verdict says
    where the match's text lies in this one."""
    shared = () if kind == "duplicate" else tuple(passages(sketch.anchors, other.anchors, PASSAGES))
    canonical = state.head_of(other.cluster) or other.cluster_id
    decision = Decision(kind, other.article_id, *scores, canonical, exact, kept, shared)
    return decision, other.cluster, other.cluster_id


def _contained(
    sketch: Sketch, anchored: Sequence[tuple[Prospect, int]], params: DedupParams
) -> tuple[Prospect, VerdictKind, float, float] | None:
    """The candidate whose anchors make the article `partial` (one text holds at least
    containment_threshold of the other's anchors, _holds) or else `revised` (revised_threshold),
    the one of the highest share (then the earliest); with at least two anchors shared, or all of
    the fewer that the smaller text has. Returns it, the kind, and the shares (this article's
    anchors in it, its anchors in this article), from the anchors the posting lists say they
    share: the candidates' own anchors are not read."""
    mine = sketch.anchors.distinct_count

    def shares(other: Prospect, shared: int) -> tuple[float, float]:
        return min(shared / mine, 1.0), min(shared / max(other.anchor_count, 1), 1.0)

    enough = [(other, n) for other, n in anchored if n >= max(min(2, mine, other.anchor_count), 1)]
    if not enough:
        return None
    other, shared = max(enough, key=lambda pair: (max(shares(*pair)), -pair[0].seq))
    inside, contains = shares(other, shared)
    theirs = max(other.anchor_count, 1)
    partial, revised = params.containment_threshold, params.revised_threshold
    if partial is not None and (_holds(shared, mine, partial) or _holds(shared, theirs, partial)):
        return other, "partial", inside, contains
    if revised is not None and max(inside, contains) >= revised:
        return other, "revised", inside, contains
    return None


def _holds(shared: int, total: int, threshold: float) -> bool:
    """Whether a text of `total` anchors is contained where `shared` of them are: their share
    reaches the threshold, or, for a text too short for the threshold to spare any (3 to 9
    anchors at 0.9), all but one are shared. An excerpt cut inside a window of its source may
    choose an anchor at its edge that the source does not, and one of six is a sixth."""
    if min(shared / total, 1.0) >= threshold:
        return True
    return total >= 3 and shared >= total - 1 and (total - 1) / total < threshold


def fresh_settings(params: DedupParams) -> tuple[float | int | bool, ...] | None:
    """The rule's figures as the compiled run of new articles takes them (_sketch.decide_fresh, after
    the state's two caps), the same that decide reads from `params`; None where it does not run:
    without verifiers, candidates are scored from their signatures (rank)."""
    if not params.verify_perm:
        return None
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
