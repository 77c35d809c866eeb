"""The containment index on by default is an upgrade for every deployment that set nothing: state
an earlier version wrote by default (format 7, no anchors) keeps opening, with no rebuild, where
NEARDUP_CONTAINMENT_INDEX=false; under the new default it is handled as deploy/docs/operations.md
("Upgrades") says: the worker rebuilds its index from the changelog by itself (the articles it held
without anchors are found as before, by LSH, and what comes after gets the index), embedded mode and
the library refuse it, naming both ways out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

import neardup
from neardup import cli
from neardup.core.normalize import normalize
from neardup.core.params import DedupParams, IncompatibleState
from neardup.pipeline.shard import POSITION_KEY, IndexShard, Position
from neardup.pipeline.wire import Signed
from neardup.state.index import HEADER_KEY
from neardup.state.rocks import RocksState
from tests.support.changelog import Entries, compacted
from tests.support.signing import signed

SAMPLE = Path(neardup.__file__).parent / "data" / "sample_news.jsonl"
EARLIER_DEFAULT = DedupParams(containment_index=False)
NOW_S = 1_750_000_000.0


def stories() -> list[str]:
    """Stories of two sample originals each: long enough for an excerpt of a fifth to be out of
    LSH's reach, which only the containment index finds."""
    lines = [orjson.loads(line) for line in SAMPLE.read_bytes().splitlines() if line.strip()]
    originals = [a["text"] for a in lines if "-" not in a["id"]]
    return [normalize(f"{originals[n]} {originals[n + 1]}") for n in range(0, 12, 2)]


def excerpt(story: str) -> str:
    return story[200 : 200 + len(story) // 5]


def decide(shard: IndexShard, items: list[Signed], chunk: int | None = None) -> list[Any]:
    """The decisions of `items`; with `chunk`, decided and committed as the worker does."""
    if chunk is not None:
        shard.begin(chunk)
    results = shard.decide(items, chunk, now=NOW_S)
    if chunk is not None:
        shard.checkpoint()
        assert shard.changelog is not None
        shard.commit(chunk, len(shard.changelog))
    assert all(r.verdict is not None for r in results), [r.error for r in results]
    held = [shard.state.get(item.article_id) for item in items]
    return [article.decision for article in held if article is not None]


def worker_state_of_the_earlier_default(path: Path, texts: list[str]) -> Entries:
    """A worker's index and changelog as the earlier default wrote them: the index off."""
    entries: Entries = []
    shard = IndexShard(RocksState(path, layered=True), EARLIER_DEFAULT, changelog=entries)
    shard.replay({})
    shard.mark_position(0, 0)
    items = [signed(f"old{n}", text, params=EARLIER_DEFAULT) for n, text in enumerate(texts)]
    assert [d.kind for d in decide(shard, items, chunk=1)] == ["unique"] * len(texts)
    shard.state.close()
    return entries


def stored_header(path: Path) -> dict[str, Any]:
    state = RocksState(path)
    try:
        (raw,) = state.kv.get_many([HEADER_KEY])
        assert raw is not None
        return dict(orjson.loads(raw))
    finally:
        state.close()


def test_state_of_the_earlier_default_opens_with_the_index_off_and_no_rebuild(tmp_path: Path) -> None:
    texts = stories()
    entries = worker_state_of_the_earlier_default(tmp_path / "index", texts[:3])
    header = stored_header(tmp_path / "index")
    assert (header["format"], header["anchors"]) == (7, "none")
    assert DedupParams().header()["anchors"] != "none", "the default is the index on"

    shard = IndexShard(RocksState(tmp_path / "index", layered=True), EARLIER_DEFAULT, changelog=[])
    committed = Position.decode(shard.state.get_meta(POSITION_KEY))
    assert committed is not None
    assert shard.restore_point(len(entries), committed.since_ms, None) == (committed, "ok")
    copy, part = decide(shard, [signed("copy", texts[0], params=EARLIER_DEFAULT)]), excerpt(texts[1])
    assert (copy[0].kind, copy[0].match_id) == ("duplicate", "old0")
    # as before: an excerpt out of LSH's reach stays unique, and no posting list is kept
    assert decide(shard, [signed("part", part, params=EARLIER_DEFAULT)])[0].kind == "unique"
    assert shard.state.counts.postings == 0
    shard.state.close()
    assert stored_header(tmp_path / "index") == header  # nothing rewritten


def test_the_worker_rebuilds_state_of_the_earlier_default_under_the_new_default(tmp_path: Path) -> None:
    texts = stories()
    entries = worker_state_of_the_earlier_default(tmp_path / "index", texts[:3])
    params = DedupParams()
    shard = IndexShard(RocksState(tmp_path / "index", layered=True), params, changelog=[])
    assert shard.restore_point(len(entries), 0, None) == (None, "format_refused")
    assert shard.replay(compacted(entries)) == 3
    shard.mark_position(len(entries), 0)
    try:
        assert shard.state.counts.postings == 0, "the changelog's records carry no anchors"
        # the articles held are found as before: a copy is a duplicate, an excerpt out of LSH's
        # reach is not found (their anchors were never picked)
        copy = decide(shard, [signed("copy", texts[0], params=params)])[0]
        assert (copy.kind, copy.match_id) == ("duplicate", "old0")
        assert decide(shard, [signed("old-part", excerpt(texts[1]), params=params)])[0].kind == "unique"
        # what comes after the upgrade has the index: an excerpt of a new story is partial
        new, part = decide(
            shard, [signed("new", texts[4], params=params), signed("part", excerpt(texts[4]), params=params)]
        )
        assert new.kind == "unique" and (part.kind, part.match_id) == ("partial", "new") and part.passages
        assert shard.state.counts.postings > 0
    finally:
        shard.state.close()
    assert stored_header(tmp_path / "index") == params.header()


def test_embedded_mode_and_the_library_refuse_the_earlier_default_naming_both_ways_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = stories()
    source = tmp_path / "in.jsonl"
    source.write_bytes(
        b"".join(orjson.dumps({"id": f"a{n}", "text": t}) + b"\n" for n, t in enumerate(texts[:3]))
    )
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    assert (
        cli.main(["dedup", str(source), "-o", str(out), "--state", str(state), "--no-containment-index"]) == 0
    )
    assert stored_header(state)["anchors"] == "none"
    capsys.readouterr()

    assert cli.main(["dedup", str(source), "-o", str(out), "--state", str(state)]) == 2
    error = capsys.readouterr().err
    assert "anchors: stored 'none'" in error and "NEARDUP_CONTAINMENT_INDEX=false" in error
    assert "new state directory" in error
    with pytest.raises(IncompatibleState, match=r"containment_index=False\) to keep using it"):
        neardup.open(state)
    with neardup.open(state, containment_index=False) as dedup:  # no rebuild: it holds them all
        assert dedup.stats()["articles"] == 3
        verdict = dedup.check({"id": "copy", "text": texts[2]})
        assert (verdict["verdict"], verdict["match_id"]) == ("duplicate", "a2")
