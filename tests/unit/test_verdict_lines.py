"""What `neardup produce` and `neardup tail` make of messages, without a broker
(neardup.messages): the key an input line is produced under, a verdict's readable line, and the
summary of the verdicts seen."""

from __future__ import annotations

from typing import Any

from neardup.messages import id_key, verdict_line, verdicts_summary


def _verdict(article_id: str, kind: str, **more: Any) -> dict[str, Any]:
    return {
        "article_id": article_id,
        "verdict": kind,
        "canonical_id": more.pop("canonical", article_id),
        **more,
    }


def test_an_input_line_is_keyed_by_its_id_when_it_has_one() -> None:
    assert id_key(b'{"id": "a-1", "text": "t"}') == b"a-1"
    assert id_key(b'{"id": 7}') is None  # not a string id: the partitioner chooses
    assert id_key(b"[1, 2]") is None
    assert id_key(b"not json") is None


def test_a_verdict_reads_as_one_line() -> None:
    assert verdict_line(_verdict("a", "unique")) == f"{'a':<28} {'unique':<9}"
    line = verdict_line(
        _verdict(
            "b",
            "duplicate",
            canonical="a",
            match_id="a",
            jaccard=0.91,
            containment=0.95,
            contains=0.9,
            exact=False,
            passages={"spans": [{"start": 0, "end": 40, "match_start": 5, "match_end": 45}]},
        )
    )
    assert line.startswith(f"{'b':<28} {'duplicate':<9} of a (J=0.91, in=0.95, covers=0.90) cluster a")
    assert line.endswith(" passages [0:40]~[5:45]")


def test_the_summary_counts_kinds_clusters_and_latency() -> None:
    seen = [
        _verdict("a", "unique", latency_ms=4.0),
        _verdict("b", "duplicate", canonical="a", latency_ms=8.0, exact=True),
        _verdict("c", "duplicate", canonical="a", latency_ms=6.0),
    ]
    summary = verdicts_summary(seen).splitlines()
    assert summary[0] == "verdicts: 3 (unique=1, duplicate=2, partial=0, revised=0; exact re-posts=1)"
    assert summary[1] == "produce-to-verdict latency: median 6.0 ms, max 8.0 ms"
    assert summary[2] == "largest clusters: a (+2)"
