"""Bounded through the real broker: no single message stops the worker (texts that normalisation
expands, messages that hang a signing helper are dead-lettered, the rest decided); a message too
large for a dead letter is cut to fit the dead-letter topic, and the stream goes on."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from neardup.messages import DEAD_LETTER_MAX_BYTES
from tests.support.broker import TopicReader, create_topic, produce_articles
from tests.support.deployment import (
    Deployment,
    health,
    load_sample,
    run_embedded,
    verdicts_by_id,
    without_latency,
)
from tests.support.faults import HELPER_FAULT, POISON, fault_env


def _verdicts_as_embedded(
    deployment: Deployment, ordinary: list[dict[str, Any]], tmp_path: Path, timeout: float
) -> list[Any]:
    """Until every ordinary article has its verdict, each as embedded mode gives it; the /health
    answers seen meanwhile."""
    reader = TopicReader(deployment.bootstrap, deployment.topics["verdicts"])
    statuses: list[Any] = []
    verdicts = verdicts_by_id(
        reader.read_until(
            lambda r: (
                statuses.append(health(deployment.health_url(0))) or len(verdicts_by_id(r)) >= len(ordinary)
            ),
            timeout=timeout,
        )
    )
    expected = {v["article_id"]: without_latency(v) for v in run_embedded(ordinary, tmp_path)}
    assert set(verdicts) == set(expected), (sorted(set(expected) - set(verdicts)), deployment.logs())
    for article_id, versions in verdicts.items():
        assert all(without_latency(v) == expected[article_id] for v in versions), article_id
    return statuses


def _alive_and_never_stalled(deployment: Deployment, worker: Any, statuses: list[Any]) -> None:
    assert worker.poll() is None, deployment.logs()
    assert all(s is None or s[0] == 200 for s in statuses), [s for s in statuses if s and s[0] != 200]
    assert "stall" not in deployment.log_text()


@pytest.mark.budget(40)  # each message that hangs a helper costs one timeout per halving of its batch
def test_no_single_message_stops_the_worker(deployment: Deployment, tmp_path: Path) -> None:
    """A hundred texts that NFKC expands eighteenfold (U+FDFA), just under the size limit, and two
    messages that hang any signing helper given them, then fifty ordinary articles: each heavy text
    is dead-lettered (oversized), each hanging one isolated and dead-lettered (processing_failed),
    every ordinary article gets the verdict embedded mode gives it, and the worker never exits nor
    reports a stall."""
    limit = 20_000
    ordinary = load_sample(50)
    heavy = [{"id": f"heavy-{n}", "text": "\ufdfa" * (limit // 3 - 20)} for n in range(100)]
    poison = [{"id": f"poison-{n}", "text": POISON.decode()} for n in range(2)]
    deployment.extra_env.update(
        {
            **fault_env(HELPER_FAULT, "hang:signer:poison"),
            "NEARDUP_MAX_TEXT_BYTES": str(limit),
            "NEARDUP_HELPER_TIMEOUT": "1",
            "NEARDUP_HELPER_ITEM_TIMEOUT_MS": "0",
            "NEARDUP_SIGN_BATCH": "32",
            "NEARDUP_STALL_TIMEOUT": "5",
        }
    )
    worker = deployment.start_worker()
    produce_articles(deployment.bootstrap, deployment.topics["input"], [*heavy[:50], poison[0], *heavy[50:]])
    produce_articles(deployment.bootstrap, deployment.topics["input"], [poison[1], *ordinary])
    statuses = _verdicts_as_embedded(deployment, ordinary, tmp_path, timeout=180)
    dead = TopicReader(deployment.bootstrap, deployment.topics["dead"])
    letters = [orjson.loads(r.value) for r in dead.read_until(lambda r: len(r) >= 102, timeout=60)]
    reasons = {(r["reason"], orjson.loads(base64.b64decode(r["value_b64"]))["id"][:6]) for r in letters}
    assert reasons == {("oversized", "heavy-"), ("processing_failed", "poison")}, reasons
    assert len(letters) == 102
    _alive_and_never_stalled(deployment, worker, statuses)


def test_an_article_that_breaks_the_decider_is_isolated_and_the_stream_goes_on(
    deployment: Deployment, tmp_path: Path
) -> None:
    """Two articles that make the index stage's process die as it decides them, among thirty
    ordinary ones: each is dead-lettered (processing_failed, under its input message), every
    ordinary article gets the verdict embedded mode gives it, and the worker never exits nor
    reports a stall."""
    ordinary = load_sample(30)
    poison = [
        {"id": f"poison-{n}-{POISON.decode()}", "text": load_sample(32)[30 + n]["text"]} for n in range(2)
    ]
    deployment.extra_env.update(
        {**fault_env(HELPER_FAULT, "crash:decider:poison"), "NEARDUP_STALL_TIMEOUT": "5"}
    )
    worker = deployment.start_worker()
    stream = [*ordinary[:10], poison[0], *ordinary[10:20], poison[1], *ordinary[20:]]
    produce_articles(deployment.bootstrap, deployment.topics["input"], stream)
    statuses = _verdicts_as_embedded(deployment, ordinary, tmp_path, timeout=120)
    dead = TopicReader(deployment.bootstrap, deployment.topics["dead"])
    letters = [orjson.loads(r.value) for r in dead.read_until(lambda r: len(r) >= 2, timeout=60)]
    assert sorted((r["reason"], base64.b64decode(r["key_b64"]).decode(), r["topic"]) for r in letters) == [
        ("processing_failed", p["id"], deployment.topics["input"]) for p in poison
    ]
    assert all("died deciding" in r["detail"] for r in letters)
    _alive_and_never_stalled(deployment, worker, statuses)


INPUT_MAX_BYTES = DEAD_LETTER_MAX_BYTES + 1024 * 1024  # an input topic that takes larger messages


async def _produce_large(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=INPUT_MAX_BYTES)
    await producer.start()
    try:
        for key, value in messages:
            await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()


def test_a_message_too_large_for_a_dead_letter_is_cut_to_fit_and_the_stream_goes_on(
    deployment: Deployment,
) -> None:
    """Just under the input topic's limit, over the text limit, and a third larger once in base64
    than the dead-letter topic takes."""
    limit = {"max.message.bytes": str(INPUT_MAX_BYTES)}
    asyncio.run(create_topic(deployment.bootstrap, deployment.topics["input"], configs=limit))
    deployment.start_worker()
    before, after = load_sample(2)
    big = b'{"id": "huge", "text": "' + b"w " * ((INPUT_MAX_BYTES - 64 * 1024) // 2) + b'"}'
    messages = [
        (before["id"].encode(), orjson.dumps(before)),
        (b"huge", big),
        (after["id"].encode(), orjson.dumps(after)),
    ]
    asyncio.run(_produce_large(deployment.bootstrap, deployment.topics["input"], messages))

    dead = TopicReader(deployment.bootstrap, deployment.topics["dead"]).read_until(
        lambda r: len(r) >= 1, timeout=120
    )
    assert len(dead) == 1, deployment.logs()
    assert len(dead[0].value) <= DEAD_LETTER_MAX_BYTES
    letter = orjson.loads(dead[0].value)
    assert letter["reason"] == "oversized" and letter["value_truncated"] is True
    assert (letter["topic"], letter["partition"], letter["offset"]) == (deployment.topics["input"], 0, 1)
    assert letter["value_size"] == len(big)
    assert letter["value_sha256"] == hashlib.sha256(big).hexdigest()
    kept = base64.b64decode(letter["value_b64"])
    assert len(kept) > len(big) // 2 and big.startswith(kept)
    verdicts = TopicReader(deployment.bootstrap, deployment.topics["verdicts"]).read_until(
        lambda r: len(r) >= 2, timeout=120
    )
    assert sorted(verdicts_by_id(verdicts)) == sorted([before["id"], after["id"]]), deployment.logs()
