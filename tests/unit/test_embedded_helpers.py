"""`neardup dedup --sign-processes`: signing in helper processes gives exactly the outputs of signing
in process, and helpers failing twice stop the run at a checkpoint a rerun resumes from."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from neardup import cli, embedded
from neardup.core.params import DedupParams
from neardup.core.signing import Sketch
from neardup.embedded import default_sign_processes, run_file
from neardup.messages import Article
from neardup.pipeline.wire import Signed
from neardup.state.memory import MemoryState
from tests.support.faults import HELPER_FAULT, inject

SAMPLE = Path(embedded.__file__).parent / "data" / "sample_news.jsonl"
MAX_TEXT_BYTES = 50_000


def mixed_input() -> bytes:
    """The sample news with, in between, malformed lines, a deletion, an update, a re-delivery,
    an oversized text, blank lines and published_at times (valid, unparseable, far ahead). Every
    article is dated (`dated_every`), so that none is timed by the clock; a later date expires
    the first ones."""
    lines = SAMPLE.read_bytes().splitlines()
    first, second = orjson.loads(lines[0]), orjson.loads(lines[1])
    lines[0] = orjson.dumps({**first, "published_at": "2011-04-01T00:00:00Z"})
    extras = {
        3: [b'{"id": "bad-utf8", "text": "caf\xe9 \xff"}', b""],
        40: [b'{"id": "cut", "text": "the json ends'],
        77: [orjson.dumps({"id": first["id"], "deleted": True})],
        90: [orjson.dumps({**second, "text": second["text"] + " An update, later that day."})],
        130: [orjson.dumps({"id": "big", "text": "word " * (MAX_TEXT_BYTES // 4)})],
        160: [b'{"id": 7, "text": "an id that is not a string"}', b"   "],
        200: [orjson.dumps({"id": "empty", "text": " \n "})],
        230: [orjson.dumps({**first, "id": "dated", "published_at": "2011-06-20T10:00:00Z"})],
        260: [orjson.dumps({**second, "id": "bad-date", "published_at": "yesterday"})],
        300: [orjson.dumps({**second, "id": "ahead", "published_at": "2999-01-01T00:00:00Z"})],
        350: [lines[5], orjson.dumps({"id": "never-seen", "deleted": True})],
    }
    out = []
    for number, line in enumerate(lines):
        out += [line, *extras.get(number, [])]
    return b"".join(line + b"\n" for line in dated_every(out))


def dated_every(lines: list[bytes]) -> list[bytes]:
    """Articles without a published_at get one: four hours after the one before, then, from the
    article "dated" on (fifty days later), a minute after it. Other lines stay as they are."""
    clock, step = datetime(2011, 4, 1, tzinfo=UTC), timedelta(hours=4)
    out = []
    for line in lines:
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError:
            item = None
        if not isinstance(item, dict) or "text" not in item:
            out.append(line)
        elif "published_at" in item:
            if item["id"] == "dated":
                clock, step = datetime.fromisoformat(item["published_at"]), timedelta(minutes=1)
            out.append(line)
        else:
            clock += step
            out.append(orjson.dumps({**item, "published_at": clock.isoformat()}))
    return out


def dead_letters(path: Path) -> list[dict]:
    """Dead letters without their failure time, which differs between two runs."""
    return [
        {k: v for k, v in orjson.loads(line).items() if k != "failed_at"}
        for line in path.read_bytes().splitlines()
    ]


def outputs(tmp_path: Path, source: Path, processes: int, capsys: pytest.CaptureFixture[str]) -> dict:
    run = tmp_path / f"run-{processes}"
    run.mkdir()
    argv = ["dedup", str(source), "-o", str(run / "out.jsonl"), "--state", str(run / "state"), "-q"]
    argv += ["--unique-out", str(run / "feed.jsonl"), "--retention", "30d"]
    argv += ["--max-text-bytes", str(MAX_TEXT_BYTES), "--sign-processes", str(processes)]
    assert cli.main(argv) == 0
    summary = re.sub(r"; [0-9.]+s, [0-9,]+ articles/s", "", capsys.readouterr().out)
    assert cli.main(["stats", "--state", str(run / "state"), "--json"]) == 0
    stats = orjson.loads(capsys.readouterr().out)
    stats.pop("bytes_on_disk")
    # a refused date takes the newest date held, not the clock: the same in every run
    assert stats["newest_ms"] < datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000
    return {
        "verdicts": (run / "out.jsonl").read_bytes(),
        "dead": dead_letters(run / "out.jsonl.dead.jsonl"),
        "feed": (run / "feed.jsonl").read_bytes(),
        "summary": summary,
        "stats": stats,
    }


def test_helpers_give_the_outputs_of_signing_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(embedded, "SIGN_BATCH", 48)  # many batches, split across both helpers
    source = tmp_path / "in.jsonl"
    source.write_bytes(mixed_input())
    here = outputs(tmp_path, source, 0, capsys)
    helpers = outputs(tmp_path, source, 2, capsys)
    assert helpers["verdicts"] == here["verdicts"]
    assert helpers["dead"] == here["dead"]
    assert helpers["feed"] == here["feed"]
    assert helpers["summary"] == here["summary"]
    assert helpers["stats"] == here["stats"]
    reasons = sorted(d["reason"] for d in here["dead"])
    assert reasons == ["empty_text", "invalid_json", "invalid_utf8", "oversized", "schema_violation"]
    assert "deleted=1 unknown_deletes=1 expired=" in here["summary"]
    assert "refused_times=2" in here["summary"] and here["stats"]["expired"] > 200
    assert here["feed"] and here["stats"]["articles"] > 100


def test_an_unexpected_signing_error_is_a_dead_letter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from neardup.pipeline.sign import SignStage

    real = SignStage.signed

    def failing(stage: SignStage, article: Article, sketch: Sketch, *args: Any) -> Signed:
        if "poison" in article.text:
            raise RuntimeError("cannot sign this")
        return real(stage, article, sketch, *args)

    monkeypatch.setattr(SignStage, "signed", failing)
    source = tmp_path / "in.jsonl"
    lines = SAMPLE.read_bytes().splitlines()[:3]
    source.write_bytes(b"\n".join([lines[0], b'{"id": "p", "text": "poison pill"}', *lines[1:]]) + b"\n")
    summary = run_file(source, tmp_path / "out.jsonl", MemoryState(), DedupParams())
    assert summary.dead_letters == {"internal_error": 1} and sum(summary.verdicts.values()) == 3
    (dead,) = dead_letters(tmp_path / "out.jsonl.dead.jsonl")
    assert (dead["offset"], dead["detail"]) == (2, "RuntimeError: cannot sign this")


def test_helpers_that_cannot_start_stop_the_run_and_a_rerun_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = SAMPLE.read_bytes().splitlines(keepends=True)[:120]
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "in.jsonl").write_bytes(b"".join(lines))
    run_file(reference / "in.jsonl", reference / "out.jsonl", MemoryState(), DedupParams())

    source, out, state = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "state"
    argv = ["dedup", str(source), "-o", str(out), "--state", str(state), "-q", "--sign-processes", "1"]
    source.write_bytes(b"".join(lines[:70]))
    assert cli.main(argv) == 0
    done = out.read_bytes()
    capsys.readouterr()

    with source.open("ab") as more:
        more.write(b"".join(lines[70:]))
    inject(monkeypatch, HELPER_FAULT, "crash:signer:0")  # no helper can start
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "cannot start" in err and "checkpointed after line 70" in err
    assert out.read_bytes() == done

    monkeypatch.delenv(HELPER_FAULT)
    assert cli.main(argv) == 0
    assert "resumed at line 71" in capsys.readouterr().out
    assert out.read_bytes() == (reference / "out.jsonl").read_bytes()


def test_the_default_leaves_one_cpu_to_decide_and_signs_here_under_16_mib(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    large = embedded.HELPERS_FROM_BYTES
    monkeypatch.setattr(embedded.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert default_sign_processes(large) == 3
    assert default_sign_processes(large - 1) == 0
    monkeypatch.setattr(embedded.os, "sched_getaffinity", lambda pid: {0})
    assert default_sign_processes(large) == 1
    assert default_sign_processes(0) == 0


def test_neardup_dedup_takes_its_default_from_the_input_size(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --sign-processes, the rule is asked with the input's size, and its answer is used."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"id": "a", "text": "a short text of a few words"}\n')
    asked: list[int] = []
    monkeypatch.setattr(embedded, "default_sign_processes", lambda size: asked.append(size) or 0)
    assert cli.main(["dedup", str(source), "-o", str(tmp_path / "out.jsonl"), "-q"]) == 0
    assert asked == [source.stat().st_size]
    assert "unique=1" in capsys.readouterr().out
