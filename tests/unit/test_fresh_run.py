"""The compiled run of articles (_sketch.decide_fresh through IndexState.add_fresh) against the
Python decision it stands in for (tests/support/reference_decide.py's ReferenceShard: its decide
and IndexState.apply, one article at a time): the same statuses, verdicts, removals, every key and
record of the state, its counts and the applied inputs, over streams of new texts, near and exact
copies, excerpts, versions, deletions (which no run takes) and ids added again,
the sample news and the news corpus's first texts where present; containment on and off, expiry,
in memory and in RocksDB (keyed and held) under the worker's write overlay. And what it does where
it fails: nothing of the run written, the article decided again in a run of its own."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from neardup.core.compiled import _sketch
from neardup.core.dedup import fresh_settings
from neardup.core.params import DedupParams
from neardup.core.retention import NO_RETENTION, Retention
from neardup.core.shingle import ShingleOptions
from neardup.pipeline.shard import MARKER_PREFIX, IndexShard, Item
from neardup.state import held, index
from neardup.state.index import IndexState
from neardup.state.memory import MemoryKV, MemoryState
from neardup.state.port import Batch
from neardup.state.records import MAGIC as RECORD_MAGIC
from neardup.state.records import decode_probe
from neardup.state.rocks import RocksOptions, RocksState
from neardup.state.tables import ArticleVersions, seq_key
from tests.benchmarks import bench_stream
from tests.data.make_labelled_set import make_variants
from tests.support.arrivals import NOW_S, SAMPLE, in_batches, paragraphs, sample_news, signed_items, stream
from tests.support.changelog import ChangelogTable
from tests.support.reference_decide import (
    ReferenceShard,
    compiled_count,
    decided_both_ways,
    everything,
    signed_lines,
)

ON, OFF = DedupParams(), DedupParams(containment_index=False)
CORPUS = Path.home() / ".cache" / "neardup" / "news" / "corpus.jsonl"


@pytest.mark.parametrize("params", [ON, OFF], ids=["containment-on", "containment-off"])
@pytest.mark.parametrize(("seed", "size", "window_ms"), [(3, 32, None), (11, 7, 60_000), (5, 1, 90_000)])
def test_a_stream_is_decided_as_the_reference_decides_it(
    params: DedupParams, seed: int, size: int, window_ms: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = signed_items(list(stream(seed, 300)), params)
    retention = NO_RETENTION if window_ms is None else Retention(window_ms=window_ms)
    expected, taken = decided_both_ways(items, params, size, monkeypatch, retention)
    kinds = {r.kind for r in expected[0] if r.verdict}
    assert {"unique", "duplicate"} <= kinds and (params is OFF or "partial" in kinds), kinds
    assert "deleted" in {r.status for r in expected[0]}
    assert len(items) // 2 < taken < len(items), (
        "most articles are taken by runs; deletions and re-deliveries are not"
    )
    assert window_ms is None or sum(r.expired for r in expected[0]) > 0


@pytest.mark.parametrize(
    "params",
    [
        DedupParams(shingle=ShingleOptions(3, "word")),
        DedupParams(verify_perm=256, num_perm=64),
        DedupParams(threshold=0.6),
    ],
    ids=["word-shingles", "fewer-slots", "lower-threshold"],
)
def test_other_settings_decide_as_the_reference_decides(
    params: DedupParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = signed_items(list(stream(8, 200)), params)
    expected, _ = decided_both_ways(items, params, 25, monkeypatch)
    assert {"unique", "duplicate"} <= {r.kind for r in expected[0] if r.verdict}


@pytest.mark.parametrize("params", [ON, OFF], ids=["containment-on", "containment-off"])
def test_the_sample_news_is_decided_as_the_reference_decides_it(
    params: DedupParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = signed_items(sample_news(), params)
    expected, _ = decided_both_ways(items, params, 32, monkeypatch)
    kinds = {r.kind for r in expected[0]}
    assert {"partial", "duplicate"} <= kinds and (params is OFF or "revised" in kinds), kinds


@pytest.mark.skipif(
    not CORPUS.exists(), reason="the news corpus is fetched by tests/data/build_news_corpus.py"
)
def test_the_news_corpus_is_decided_as_the_reference_decides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = CORPUS.read_bytes().splitlines()[:1200]
    arrivals = [(str(n), orjson.loads(line)["text"]) for n, line in enumerate(lines)]
    items = signed_items(arrivals, ON)
    decided_both_ways(items, ON, 20, monkeypatch)


def generated(count: int, seed: int, params: DedupParams) -> list[Item]:
    """bench_stream.py's generator (a copy of a recent article in four, one copy in five exact,
    else paragraphs drawn until a news-sized length), over the sample news's paragraphs."""
    corpus = [orjson.loads(line) for line in SAMPLE.read_bytes().splitlines() if line.strip()]
    articles = bench_stream.Articles(corpus, "g", seed, dup_fraction=0.25)
    return signed_lines([articles.next()[1] for _ in range(count)], params, 1 << 20)


def labelled(seed: int, params: DedupParams) -> list[Item]:
    """A labelled set as `neardup evaluate` reads one (make_labelled_set.py's variants of sources,
    among distractors, shuffled), from the sample news."""
    rng, news = random.Random(seed), sample_news()
    rows = [(article_id, text) for article_id, text in news if text]
    for article_id, text in rows[:12]:
        rows += [(f"{article_id}~{kind}", variant) for kind, variant in make_variants(text, rng)]
    rng.shuffle(rows)
    return signed_items(rows, params)


@pytest.mark.parametrize("params", [ON, OFF], ids=["containment-on", "containment-off"])
@pytest.mark.parametrize("source", ["generator", "labelled"])
def test_the_generator_and_an_evaluation_set_are_decided_verdict_for_verdict(
    source: str, params: DedupParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benchmark's generator and an evaluation set: every verdict and the whole state as the
    reference leaves them, with a retention window expiring as it goes, the runs taking most
    articles (the fuzz corpus: test_fuzz.py)."""
    items = generated(600, 3, params) if source == "generator" else labelled(5, params)
    retention = Retention(window_ms=400_000)
    expected, taken = decided_both_ways(items, params, 24, monkeypatch, retention)
    kinds = {r.kind for r in expected[0] if r.verdict}
    assert {"unique", "duplicate"} <= kinds, kinds
    assert taken > len(items) * 0.8, (taken, len(items))


@pytest.mark.parametrize("layout", ["keyed", "held", "draining"])
def test_rocksdb_under_the_overlay_is_left_as_the_reference_leaves_it(
    layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keyed, held, and held past its bound (its entries going back to keys a step a write, a run's
    reads finding some in the table and some as keys)."""
    if layout == "draining":
        monkeypatch.setattr(held, "HELD_ENTRIES", 2_000)
        monkeypatch.setattr(held, "DRAIN_STEP", 50)
    items = signed_items(list(stream(9, 240)), ON)
    runs, drained = [], []
    for shard_type in (ReferenceShard, IndexShard):
        options = RocksOptions(hold_families=layout != "keyed")
        state = RocksState(tmp_path / shard_type.__name__, options, layered=True)
        shard = shard_type(state, ON, changelog=ChangelogTable())
        shard.restore_point(0, int(NOW_S * 1000), None)  # as a worker opens its derived state
        try:
            results = in_batches(shard, items, 20, layered=True)
            runs.append((everything(shard, results), dict(shard.changelog)))  # type: ignore[arg-type]
            drained.append(state.held is None or state.held._draining or not state.held.prefixes)
        finally:
            state.close()
    assert runs[0] == runs[1]
    assert drained == [layout != "held"] * 2


def test_full_buckets_and_boilerplate_posting_lists_are_kept_as_the_reference_keeps_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forty articles of their own paragraphs and one footer in common, and near copies of a few:
    the footer's posting lists fill to their cap (boilerplate, counted), buckets of 4 at most
    drop their oldest members; in runs of 16 as the worker's chunks."""
    pool = paragraphs()
    footer = pool[0]
    arrivals = [(f"a{n}", f"{pool[1 + n]}\n\n{pool[60 + n]}\n\n{footer}") for n in range(40)]
    arrivals += [(f"c{n}", arrivals[n][1] + " Reporting by the desk.") for n in range(0, 40, 4)]
    items = signed_items(arrivals, ON)
    expected, taken = decided_both_ways(items, ON, 16, monkeypatch, state=lambda: MemoryState(bucket_cap=4))
    counts = expected[3]
    assert taken == len(items) and counts.boilerplate > 0 and counts.largest_bucket == 4


def test_a_run_reads_its_keys_and_candidates_a_call_per_family(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before its first decision a run reads the id map, marker and content keys of all its
    articles in one call, their band keys in one, their posting lists in one, and the records its
    stored buckets name in one: not a call or more an article. Near copies of the first run's
    articles make the second run's candidates."""
    texts = paragraphs()[:16]
    arrivals = [(f"p{n}", text) for n, text in enumerate(texts)]
    arrivals += [(f"c{n}", text + " Reporting by the desk.") for n, text in enumerate(texts)]
    items = signed_items(arrivals, ON)
    first, second = items[:16], items[16:]
    reads: list[bytes] = []
    real_get, real_prospects = MemoryKV.get_many, ArticleVersions.prospects

    def get_many(self: MemoryKV, keys: list[bytes]) -> list[bytes | None]:
        reads.append(keys[0][:1])
        return real_get(self, keys)

    def prospects(self: ArticleVersions, seqs: Sequence[int]) -> list[Any]:
        reads.append(b"records")
        return real_prospects(self, seqs)

    monkeypatch.setattr(MemoryKV, "get_many", get_many)
    monkeypatch.setattr(ArticleVersions, "prospects", prospects)
    shard = IndexShard(MemoryState(), ON)
    for offset, (run, records) in enumerate(((first, 0), (second, 1))):  # the first's: its own
        reads.clear()
        decided = shard.decide(run, offset)
        once = {family: reads.count(family) for family in (b"a", b"b", b"n", b"records")}
        assert once == {b"a": 1, b"b": 1, b"n": 1, b"records": records}, reads
        # beside them, a matched article's cluster head: what its match decides
        assert reads.count(b"h") <= len(run) - [d.kind for d in decided].count("unique")
        assert len(reads) == sum(once.values()) + reads.count(b"h")
    assert [d.kind for d in decided].count("unique") < len(second) // 2, "copies found"


def test_a_failing_read_leaves_the_article_to_the_next_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store fails twice on the reads that name the third article's buckets: the run's read
    ahead (its decisions then read for themselves), then the third article's own read, mid-run.
    The run stops before it, nothing of it written, and the next run, that starts with it,
    decides it (the store answering by then)."""
    items = signed_items(list(stream(1, 60)), ON)
    reference = ReferenceShard(MemoryState(), ON)
    expected = everything(reference, in_batches(reference, items, 16))
    third = b"b" + items[2].band_keys[0]  # type: ignore[union-attr]
    real, failures, runs = MemoryKV.get_many, [0], []

    def twice(self: MemoryKV, keys: list[bytes]) -> list[bytes | None]:
        if third in keys and failures[0] < 2:
            failures[0] += 1
            raise OSError("injected")
        return real(self, keys)

    def counted(self: IndexState, rows: list[Any], *args: Any) -> list[Any]:
        runs.append((rows[0][0], len(taken := real_add(self, rows, *args))))
        return taken

    real_add = IndexState.add_fresh
    monkeypatch.setattr(MemoryKV, "get_many", twice)
    monkeypatch.setattr(IndexState, "add_fresh", counted)
    shard = IndexShard(MemoryState(), ON)
    assert everything(shard, in_batches(shard, items, 16)) == expected
    assert failures == [2]
    assert runs[0] == (items[0].article_id, 2) and runs[1][0] == items[2].article_id


class Halt(BaseException):
    """Not an Exception: what a run passes on rather than leaves to the decisions."""


def test_a_read_ahead_that_is_interrupted_raises_and_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Exception in the run's read-ahead leaves the reads to the decisions; anything else (an
    interrupt) comes out of the call as it was raised, nothing written."""
    real = MemoryKV.get_many

    def interrupted(self: MemoryKV, keys: list[bytes]) -> list[bytes | None]:
        if len(keys) > 3:  # the read-ahead's: a decision reads one article's keys
            raise Halt
        return real(self, keys)

    monkeypatch.setattr(MemoryKV, "get_many", interrupted)
    shard = IndexShard(MemoryState(), ON)
    signed = signed_items([(f"p{n}", text) for n, text in enumerate(paragraphs()[:3])], ON)
    rows = [(*i[:8], i.time_ms, None, None) for i in signed]  # a signed record's first fields are a row's
    with pytest.raises(Halt):
        shard.state.add_fresh(rows, fresh_settings(ON) or (), b"{}")
    assert shard.state.next_seq() == 0 and not list(shard.state.kv.scan_records())


def test_a_run_that_raises_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error the compiled call raises rather than leaves to the next run (a version's removal
    failing): none of the run is written; the shard decides on, one article a run until the one
    that failed is decided."""
    items = signed_items(list(stream(6, 40)), ON)
    reference = ReferenceShard(MemoryState(), ON)
    expected = everything(reference, in_batches(reference, items, 10))
    real, calls = index.first_key, [0]

    def failing(*args: Any) -> bytes | None:
        calls[0] += 1
        if calls[0] == 1:
            raise MemoryError("injected")
        return real(*args)

    monkeypatch.setattr(index, "first_key", failing)
    shard = IndexShard(MemoryState(), ON)
    texts = paragraphs()[:3]
    arrivals = [("p0", texts[0]), ("p1", texts[1]), ("p0", texts[2])]  # p0's second version
    signed = signed_items(arrivals, ON)
    rows = [(*i[:8], i.time_ms, None, None) for i in signed]  # a signed record's first fields are a row's
    with pytest.raises(MemoryError):
        shard.state.add_fresh(rows, fresh_settings(ON) or (), b"{}")
    assert calls == [1]
    assert shard.state.next_seq() == 0 and not list(shard.state.kv.scan_records())
    assert shard.state.versions.prospects([0, 1]) == [None, None]
    calls[0] = 0  # fails again in the shard's first run that replaces a version
    assert everything(shard, in_batches(shard, items, 10)) == expected
    assert calls[0] > 1


def test_an_exact_copy_of_an_expired_holder_takes_the_content_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder is before the copy's retention cutoff, not yet removed by an expiry pass: it is
    no match, and the copy, decided by its bands in the run, unique, takes the content over."""
    text = sample_news()[1][1]
    old, copy = signed_items([("old", text), ("copy", text)], ON)
    items = [old, copy._replace(time_ms=old.time_ms + 10_000)]  # type: ignore[union-attr]
    retention = Retention(window_ms=2_500)
    expected, taken = decided_both_ways(items, ON, 2, monkeypatch, retention)
    assert taken == 2 and [r.kind for r in expected[0]] == ["unique", "unique"]
    assert expected[0][1].expired == 1


def test_a_run_stops_at_what_it_does_not_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new version and a revived id are decided in the run, its version taken out where the run
    left it, with a verifier or without one (scored on the signatures); a deletion ends the run
    and is answered apart: of these arrivals the runs take all but the deletion."""
    text = sample_news()[0][1]
    assert text is not None
    arrivals = [("a", text), ("b", text), ("a", text + " Updated."), ("a", None), ("a", text + " Again.")]
    taken = compiled_count(monkeypatch)
    for params in (ON, DedupParams(verify_perm=0)):
        items = signed_items(arrivals, params)
        reference = ReferenceShard(MemoryState(), params)
        expected = everything(reference, in_batches(reference, items, 5))
        taken[0] = 0
        shard = IndexShard(MemoryState(), params)
        assert everything(shard, in_batches(shard, items, 5)) == expected
        assert taken == [4] and [r.status for r in expected[0]] == [
            "new",
            "new",
            "new",
            "deleted",
            "new",
        ]
        assert expected[0][1].kind == "duplicate" and orjson.loads(expected[0][1].verdict or b"")["exact"]


@pytest.mark.parametrize("size", [1, 3, 16])
@pytest.mark.parametrize("params", [ON, OFF], ids=["containment-on", "containment-off"])
def test_versions_and_revived_ids_are_decided_by_the_run_as_the_reference_decides_them(
    params: DedupParams, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Versions that take out a content's holder (its exact copy takes over, joining the buckets)
    and a cluster's first article (the cluster is handed on), versions one after another, a version
    sent again (the shard answers it with its stored verdict), a revived id whose text is an exact
    copy: the whole state and every verdict as the reference leaves them, and the run takes all but the
    deletion and the re-delivery."""
    pool = paragraphs()
    first, second, third = pool[0] + "\n\n" + pool[1], pool[2] + "\n\n" + pool[3], pool[4]
    near = first.replace(" the ", " a ", 2)
    arrivals: list[tuple[str, str | None]] = [
        ("a", first),
        ("copy", first),  # exact: beside a, out of the buckets
        ("near", near),  # a's cluster
        ("a", second),  # a goes: copy holds the content, the cluster goes on under copy
        ("a", second + " Updated."),
        ("a", second + " Updated."),  # sent again: the stored verdict
        ("a", third),
        ("near", None),
        ("near", first),  # revived, an exact copy of copy's content
        ("fresh", pool[5]),
    ]
    items = signed_items(arrivals, params)
    expected, taken = decided_both_ways(items, params, size, monkeypatch)
    assert taken == len(arrivals) - 2
    statuses = [r.status for r in expected[0]]
    assert statuses == ["new"] * 5 + ["redelivered", "new", "deleted", "new", "new"], statuses
    revived = orjson.loads(expected[0][8].verdict or b"")
    assert (revived["verdict"], revived["exact"], revived["version"]) == ("duplicate", True, 1), revived


def test_a_removal_that_fails_in_the_run_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replaced version's removal raises, once, inside the run: nothing of the run is written,
    the counts it moved are read again from the store, and the shard decides on, one article a run
    to the same state."""
    items = signed_items(list(stream(9, 120)), ON)
    reference = ReferenceShard(MemoryState(), ON)
    expected = everything(reference, in_batches(reference, items, 8))
    real, failures = index.first_key, [0]

    def once(*args: Any) -> bytes | None:
        found = real(*args)  # the removal's writes so far in the run's batch, then the failure
        if not failures[0]:
            failures[0] += 1
            raise OSError("injected")
        return found

    monkeypatch.setattr(index, "first_key", once)
    shard = IndexShard(MemoryState(), ON)
    assert everything(shard, in_batches(shard, items, 8)) == expected
    assert failures == [1]


@pytest.mark.parametrize("damaged", ["head", "body", "marker"])
def test_a_version_over_a_record_or_marker_that_does_not_decode_fails_alone(damaged: str) -> None:
    """The run reads the version an article replaces (or the revived id's deletion marker) itself:
    one that does not decode, in its head (which its probe reads) or past it (which the removal
    reads), fails that article, with CorruptRecord naming what is wrong, and the next article of
    the batch is decided."""
    texts = paragraphs()
    shard = IndexShard(MemoryState(), ON)
    before = [("a", texts[0]), ("b", texts[1]), *([("a", None)] if damaged == "marker" else [])]
    statuses = [r.status for r in shard.decide(signed_items(before, ON))]
    assert statuses == ["new", "new", "deleted"][: len(before)]
    (record,) = shard.state.kv.records([seq_key(0)])
    batch, expected = Batch(), "state record '0' cannot be decoded"
    if damaged == "head":
        batch.records[seq_key(0)] = RECORD_MAGIC + b"\x80"  # a varint of the head that never ends
    elif damaged == "body":  # its decision cut short: the head and verifier whole
        assert record is not None
        batch.records[seq_key(0)] = record[: decode_probe(record).anchors_at - 1]
        expected += ": record is truncated"
    else:
        batch.main[MARKER_PREFIX + b"a"], expected = b"short", "deletion marker of 'a' has 5 bytes"
    shard.state.kv.write(batch)
    results = shard.decide(signed_items([("a", texts[2]), ("c", texts[3])], ON))
    assert [r.status for r in results] == ["error", "new"], results
    assert (results[0].error or "").startswith(f"CorruptRecord: {expected}"), results[0].error


def test_bad_rows_and_contexts_are_refused() -> None:
    state = MemoryState()
    settings = (512, 160, *([0] * 14))
    context: tuple[Any, ...] = (
        state.kv.get_many,
        state.postings.stored,
        state.versions.prospects,
        print,
        print,
        print,
        {},
        {},
        [],
        [],
        [],
        [0],
    )
    with pytest.raises(TypeError):
        _sketch.decide_fresh([("id",)], 0, (*context, None, 0, b"{}", settings))
    with pytest.raises(TypeError):
        _sketch.decide_fresh([], 0, (*context[:-1], None, 0, b"{}", settings))
    with pytest.raises(ValueError, match="candidate counts"):
        _sketch.decide_fresh([], 0, (*context, None, 0, b"{}", (512, 160, -1, *([0] * 13))))
    assert _sketch.decide_fresh([], 7, (*context, None, 0, b"{}", settings)) == (
        [],
        0,
        (0, 0, 0, 0, 0, None, 7),
    )
