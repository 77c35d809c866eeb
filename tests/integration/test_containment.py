"""Excerpts and revisions through the real broker and RocksDB: an excerpt published after its
source and one published before it get `partial`, a rewrite reusing part of a story gets
`revised`, each verdict naming the passages; the revised one passes the filtered feed."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from neardup.core.normalize import normalize
from tests.support.broker import TopicReader, produce
from tests.support.deployment import Deployment, load_sample
from tests.support.schemas import schema_errors


def _story(sample: list[dict[str, Any]], first: int) -> str:
    """Two sample originals back to back: a story long enough for an excerpt of a fifth."""
    originals = [a["text"] for a in sample if "-" not in a["id"]]
    return normalize(f"{originals[first]} {originals[first + 1]}")


def test_excerpts_in_either_order_are_partial_and_a_rewrite_is_revised(deployment: Deployment) -> None:
    sample = load_sample()
    story, later_story, other = _story(sample, 0), _story(sample, 4), _story(sample, 8)
    excerpt = story[200 : 200 + len(story) // 5]
    early_excerpt = later_story[300 : 300 + len(later_story) // 4]
    sentences = other.split(". ")
    half = len(sentences) // 2
    rewrite = ". ".join(sentences[half:] + _story(sample, 12).split(". ")[:half])
    articles = [
        {"id": "story", "text": story},
        {"id": "story-excerpt", "text": excerpt},  # after its source
        {"id": "teaser", "text": early_excerpt},  # before its source
        {"id": "full", "text": later_story},
        {"id": "original", "text": other},
        {"id": "rewrite", "text": rewrite},
    ]
    deployment.extra_env["NEARDUP_UNIQUE_TOPIC"] = deployment.topics["input"] + "-unique"
    deployment.extra_env["NEARDUP_CONTAINMENT_INDEX"] = "true"
    deployment.start_worker()
    messages = [(a["id"].encode(), orjson.dumps(a)) for a in articles]
    asyncio.run(produce(deployment.bootstrap, deployment.topics["input"], messages))
    records = TopicReader(deployment.bootstrap, deployment.topics["verdicts"]).read_until(
        lambda r: len(r) >= len(articles), timeout=120
    )
    verdicts = {v["article_id"]: v for v in (orjson.loads(r.value) for r in records)}
    assert {name: v["verdict"] for name, v in verdicts.items()} == {
        "story": "unique",
        "story-excerpt": "partial",
        "teaser": "unique",
        "full": "partial",
        "original": "unique",
        "rewrite": "revised",
    }, deployment.logs()
    texts = {a["id"]: normalize(a["text"]) for a in articles}  # what the offsets index
    for name, match in (("story-excerpt", "story"), ("full", "teaser"), ("rewrite", "original")):
        verdict = verdicts[name]
        assert verdict["match_id"] == match and not schema_errors("verdict", verdict)
        spans = verdict["passages"]["spans"]
        assert verdict["passages"]["offsets"] == "canonical" and spans
        for span in spans:
            mine = texts[name][span["start"] : span["end"]]
            assert mine and mine == texts[match][span["match_start"] : span["match_end"]]
    assert verdicts["story-excerpt"]["containment"] == 1.0  # the excerpt's anchors are all the story's
    assert verdicts["full"]["contains"] == 1.0
    feed = TopicReader(deployment.bootstrap, deployment.topics["input"] + "-unique").read_until(
        lambda r: len(r) >= 4, timeout=60
    )
    assert sorted(r.key.decode() for r in feed) == ["original", "rewrite", "story", "teaser"]
