"""Signing by the batch (core/signing.py: SketchBatch; pipeline/sign.py: SigningBatch), its
compiled passes on a thread of their own, against the plain path it replaces in `neardup dedup`:
sketch_of and SignStage.sign text by text, result for result, on real prose, the generator's
articles and odd texts, under the default settings and the others that change what is signed."""

from __future__ import annotations

import json
from pathlib import Path
from random import Random
from types import SimpleNamespace

import pytest

from neardup.core.params import DedupParams
from neardup.core.shingle import ShingleOptions
from neardup.core.signing import Sketch, SketchBatch, sketch_of
from neardup.messages import decode_message
from neardup.pipeline.sign import SigningBatch, SignResult, SignStage
from neardup.pipeline.wire import Provenance
from tests.benchmarks.bench_state_size import write_input
from tests.support.prose import PROSE

SAMPLE = Path(__file__).resolve().parents[2] / "service" / "data" / "sample_news.jsonl"
MAX_POINTS = 6_000
ODD = ["", "   \t\n ", "\u200b\u2060\ufeff", "abc", "a" * 23, "b" * 24, "e\u0301" * 40, "\ufdfa" * 400]
SETTINGS = {
    "defaults": DedupParams(),
    "containment off": DedupParams(containment_index=False),
    "smaller signatures": DedupParams(num_perm=64, verify_perm=256),
    "no verifier": DedupParams(verify_perm=0),
    "word shingles": DedupParams(shingle=ShingleOptions(unit="word", k=3)),
}


def texts(tmp_path: Path) -> list[str]:
    """The sample's news, the generator's articles (near copies among them), and odd texts:
    empty, invisible, shorter than k or than an anchor, expanding past MAX_POINTS."""
    generated = tmp_path / "generated.jsonl"
    write_input(generated, 120, seed=3)
    lines = SAMPLE.read_text().splitlines() + generated.read_text().splitlines()
    rng = Random(5)
    mixed = [" ".join(rng.sample(PROSE, 3)) + rng.choice(ODD) * rng.randrange(3) for _ in range(30)]
    return [json.loads(line)["text"] for line in lines] + ODD + mixed


def outcome(result: Sketch | Exception) -> object:
    """A sketch as it compares, or an exception by its type and message."""
    return result if isinstance(result, Sketch) else (type(result), str(result))


def as_compared(result: object) -> object:
    """A signed record as it is, a dead letter without the time it was written."""
    if isinstance(result, SignResult) and result.dead_letter is not None:
        return result.reason, {k: v for k, v in json.loads(result.dead_letter).items() if k != "failed_at"}
    return result


def plainly(text: str, params: DedupParams) -> Sketch | Exception:
    try:
        return sketch_of(text, params, MAX_POINTS)
    except Exception as exc:
        return exc


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_batch_gives_each_text_what_sketch_of_gives_it(setting: str, tmp_path: Path) -> None:
    params, given = SETTINGS[setting], texts(tmp_path)
    expected = [outcome(plainly(text, params)) for text in given]
    # in batches of every size the pipeline may make, the last one short
    got: list[object] = []
    for size in (1, 32, len(given)):
        got = []
        for start in range(0, len(given), size):
            got += map(outcome, SketchBatch(given[start : start + size], params, MAX_POINTS).results())
        assert got == expected
    refused = sum(not isinstance(result, Sketch) for result in got)
    assert 0 < refused < len(given) // 4  # the odd texts refused, the prose signed


def test_a_batch_whose_passes_ran_out_of_memory_signs_each_text_by_itself(tmp_path: Path) -> None:
    params, given = DedupParams(), texts(tmp_path)[:40]
    batch = SketchBatch(given, params, MAX_POINTS)
    batch._batch.wait()  # the thread done with the buffers

    def out_of_memory() -> list[tuple[int, int, int]]:
        raise MemoryError

    batch._batch = SimpleNamespace(wait=out_of_memory)  # type: ignore[assignment]
    assert list(map(outcome, batch.results())) == [outcome(plainly(text, params)) for text in given]


def test_signing_a_batch_gives_each_message_what_signing_it_alone_gives(tmp_path: Path) -> None:
    """Articles, deletions, malformed and oversized messages, texts that leave nothing: each its
    signed record or its dead letter, as SignStage.sign and SignStage.failed give them."""
    stage = SignStage(DedupParams(), max_text_bytes=4_000)
    bodies = [
        {"id": f"a{n}", "text": text, "published_at": "2026-01-02T03:04:05Z"}
        for n, text in enumerate(texts(tmp_path))
    ]
    raws = [json.dumps(body).encode() for body in bodies]
    raws += [b'{"id": "x", "deleted": true}', b"{not json", b'{"id": 3, "text": "t"}', b"\xff\xfe"]
    messages = [(raw, None, Provenance("in.jsonl", None, n, None)) for n, raw in enumerate(raws)]

    def alone(raw: bytes, src: Provenance) -> object:
        try:
            return stage.sign(decode_message(raw, None, stage.max_text_bytes), src)
        except Exception as exc:
            return stage.failed(exc, raw, None, src)

    got = SigningBatch(stage, messages).results()
    assert list(map(as_compared, got)) == [as_compared(alone(raw, src)) for raw, _, src in messages]
    reasons = {result.reason for result in got if isinstance(result, SignResult)}
    assert {"empty_text", "oversized", "invalid_json"} <= reasons
