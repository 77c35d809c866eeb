"""The decision as it was made one article at a time in Python: the reference the compiled run
(_sketch.decide_fresh, through IndexState.add_fresh and IndexShard) is tested on, verdict for
verdict and key for key (tests/unit/test_fresh_run.py).

`decide` reads the state through the StateReader port only and returns the verdict with the
update to apply (IndexState.apply): exact-content fast path → LSH candidates → verification →
verdict. `ReferenceShard` is an IndexShard that decides every article so, one at a time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest

from neardup.core.anchors import passages
from neardup.core.compiled import _sketch
from neardup.core.dedup import (
    ANCHOR_CANDIDATES,
    PASSAGES,
    Candidate,
    Decision,
    IndexedArticle,
    IndexUpdate,
    Prospect,
    StateReader,
    VerdictKind,
    score,
)
from neardup.core.lsh import band_keys
from neardup.core.minhash import CHANCE_AGREEMENT, EMPTY_VERIFIER_SLOT, verified_scores
from neardup.core.params import DedupParams
from neardup.core.retention import NO_RETENTION, Retention
from neardup.core.signing import Sketch
from neardup.pipeline.shard import (
    ARTICLE_PREFIX,
    MARKER_PREFIX,
    POSITION_KEY,
    Decided,
    IndexShard,
    Item,
)
from neardup.pipeline.sign import SignStage
from neardup.pipeline.wire import Provenance, Signed, SignedDeletion, decode_signed
from neardup.state.index import META, IndexState
from neardup.state.memory import MemoryState
from neardup.state.records import encode_record
from tests.support.arrivals import in_batches


@dataclass(frozen=True)
class Outcome:
    """The verdict-worthy result of one article: its record, and the update (None on re-delivery)."""

    article: IndexedArticle
    update: IndexUpdate | None

    @property
    def redelivered(self) -> bool:
        return self.update is None


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


class ReferenceShard(IndexShard):
    """An IndexShard that decides every article one at a time by `decide` and IndexState.apply,
    as the shard did before its compiled run: what the run is compared with."""

    def decide(
        self,
        items: Sequence[Item],
        offset: int | None = None,
        now: float | None = None,
        before: Callable[[int], None] | None = None,
        records: Sequence[int] | None = None,
    ) -> list[Decided]:
        now_s = time.time() if now is None else now
        at = -1 if offset is None else offset
        results: list[Decided] = []
        for n, item in enumerate(items):
            if before is not None:
                before(n)
            try:
                result = self._decide_one(item, at, now_s)
            except Exception as exc:  # as the shard: one bad record does not stop it
                result = Decided.failed(at, exc)
            results.append(result if records is None else result._replace(record=records[n]))
        if offset is not None:
            self.applied_offset = max(self.applied_offset, offset)
        return results

    def _decide_one(self, item: Item, offset: int, now_s: float) -> Decided:
        """An input applied already and a deletion as the shard answers them (IndexShard._answer);
        any other article decided by `decide` and applied."""
        if isinstance(item, SignedDeletion) or (offset >= 0 and self._replayed(item, offset, self.inputs)):
            return self._answer(item, offset, now_s)
        if offset >= 0:
            self.inputs[input_key(item.provenance)] = item.provenance.offset
        if item.refused_time:
            self.counts.refused_times += 1
        time_ms, cutoff = event_time(item, now_s, self.state.counts.newest_ms, self.retention)
        keys = item.band_keys_for(self.params.lsh.bands, self.params.lsh.rows)
        outcome = decide(item.article_id, item.sketch, self.state, self.params, keys, time_ms, cutoff)
        if outcome.update is not None:
            record = encode_record(outcome.article)
            self.state.apply(outcome.update, record=record)
            if self.changelog is not None:
                self.changelog.append((ARTICLE_PREFIX + item.article_id.encode(), record))
                if outcome.update.revived:
                    self.changelog.append((MARKER_PREFIX + item.article_id.encode(), None))
        expired = self._expire_due()
        status = "redelivered" if outcome.redelivered else "new"
        return self._verdict(status, outcome.article, item, offset, now_s, expired)

    def _replayed(self, item: Item, offset: int, inputs: dict[str, int]) -> bool:
        return replayed(item.provenance, offset, self.applied_offset, inputs)


# -- the shard's rules for each article as Python wrote them: what _sketch's (service/core/_shard.c)
# are compared with (tests/unit/test_shard_rules.py)


def input_key(src: Provenance) -> str:
    """The input partition an item came from, as the applied inputs name it."""
    return f"{src.topic}:{src.partition}"


def replayed(src: Provenance, offset: int, applied_offset: int, inputs: dict[str, int]) -> bool:
    """Whether the item's input is applied already: its signatures message, or its offset in its
    input partition (`inputs`: the offsets applied, as the batch has moved them so far)."""
    return offset <= applied_offset or src.offset <= inputs.get(input_key(src), -1)


def latency_ms(timestamp_ms: int | None, now_ms: float) -> float | None:
    """Milliseconds from the article's message to its verdict, None where the message has no time."""
    return None if timestamp_ms is None else round(max(now_ms - timestamp_ms, 0.0), 3)


def event_time(
    item: Signed, now_s: float, newest: int | None, retention: Retention
) -> tuple[int, int | None]:
    """The article's event time and the retention cutoff it is decided against, `newest` being
    the newest time the index holds: a refused time is taken as that newest time; no time runs
    ahead of the clock by more than the skew."""
    if item.refused_time and newest is not None:
        time_ms = newest
    else:
        time_ms = min(item.time_ms, round(now_s * 1000) + retention.skew_ms)
    return time_ms, retention.cutoff(time_ms if newest is None else max(newest, time_ms))


def fresh_rows(
    items: Sequence[Item], offset: int, applied_offset: int, inputs: dict[str, int], newest: int | None,
    expired_before: int | None, now_s: float, retention: Retention, params: DedupParams,
) -> list[tuple[Any, ...]]:  # fmt: skip
    """The rows of a compiled run as the shard made them in Python (_sketch.fresh_rows)."""
    rows: list[tuple[Any, ...]] = []
    lsh = params.lsh
    for item in items:
        if isinstance(item, SignedDeletion):
            break
        if offset >= 0 and replayed(item.provenance, offset, applied_offset, inputs):
            break
        inputs[input_key(item.provenance)] = item.provenance.offset
        time_ms, cutoff = event_time(item, now_s, newest, retention)
        keys = item.band_keys_for(lsh.bands, lsh.rows) or band_keys(
            item.sketch.signature, lsh.bands, lsh.rows
        )
        latency = latency_ms(item.provenance.timestamp_ms, now_s * 1000.0)
        rows.append((*item[:2], tuple(keys), *item[3:8], time_ms, cutoff, latency))
        newest = time_ms if newest is None else max(newest, time_ms)
        expiry = retention.cutoff(newest)
        step = max(1000, retention.window_ms // 1000)
        if expiry is not None and (expired_before is None or expiry - expired_before >= step):
            break  # an expiry pass is due: it runs before the next article is decided
    return rows


def everything(shard: IndexShard, results: list[Decided]) -> tuple[Any, ...]:
    """What a run leaves: its results (latency and all) and the whole state, but the time a
    derived state's position was taken at (the clock's)."""
    state = shard.state
    keys = [(key, value) for key, value in state.kv.scan(b"") if key != META + POSITION_KEY]
    return (results, sorted(keys), sorted(state.kv.scan_records()), state.counts, state.next_seq(),
            shard.inputs, shard.counts)  # fmt: skip


def compiled_count(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many articles the compiled run took, counted as it goes."""
    taken = [0]
    real = IndexState.add_fresh

    def counting(self: IndexState, *args: Any, **kwargs: Any) -> list[tuple[bytes, bytes, str, bool]]:
        written = real(self, *args, **kwargs)
        taken[0] += len(written)
        return written

    monkeypatch.setattr(IndexState, "add_fresh", counting)
    return taken


def decided_both_ways(
    items: list[Item],
    params: DedupParams,
    size: int,
    monkeypatch: pytest.MonkeyPatch,
    retention: Retention = NO_RETENTION,
    state: Callable[[], IndexState] = MemoryState,
) -> tuple[tuple[Any, ...], int]:
    """`items` decided in batches of `size` by ReferenceShard and by the compiled run (IndexShard),
    each on a new `state()`: asserts that both leave the same results and state (`everything`);
    returns what they leave, and how many articles the compiled runs took."""
    reference = ReferenceShard(state(), params, retention)
    expected = everything(reference, in_batches(reference, items, size))
    taken = compiled_count(monkeypatch)
    shard = IndexShard(state(), params, retention)
    assert everything(shard, in_batches(shard, items, size)) == expected
    return expected, taken[0]


def signed_lines(lines: Sequence[bytes], params: DedupParams, max_text_bytes: int) -> list[Item]:
    """The lines of an input file as the worker's signer leaves them: those it refuses (dead
    letters) never reach the shard."""
    stage = SignStage(params, max_text_bytes)
    items: list[Item] = []
    for n, line in enumerate(lines):
        src = Provenance("articles", 0, n, 1_700_000_000_000 + n * 1000)
        result = stage.handle(line.rstrip(b"\r\n"), None, src)
        if result.signed is not None:
            items.append(decode_signed(result.signed))
    return items
