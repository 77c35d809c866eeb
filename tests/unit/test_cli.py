"""The `neardup` command line: compare, tune, evaluate, and --help everywhere."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from neardup import cli
from neardup.core.lsh import optimal_params

# Seed 004's 1.txt: GBK bytes for "—" and "é" that an ISO-8859-14 reader shows as "ḂẂ" and "ẀḊ".
SEED_004_1_TXT = (
    "NFC East rival quarterbacks Tony Romo(notes) of the Dallas Cowboys and Eli Manning(notes) of the "
    "New York Giants now have something else in common ḂẂ they've used the same wedding planner to help "
    'them tie the knot. Todd Fiscus, the man with the plan, set\nup what he called "man food" at '
    "Dallas' Arlington Hall on Saturday, when Romo married former Miss Missouri Candace Crawford.\n\n\n\n"
    '"I\'ve gotten special permission," Jones recently told ESPN\'s Ed Werder. "But more than anything, '
    "(I got the) right ticket from him and his fianceẀḊ ḂẂ Romo's wife-to-be. (It's) one of prettiest "
    "invitations I've ever seen.\n"
)
SEED_004_2_TXT = (
    "Officially, Memorial Day, observed on the last Monday of May (this year it's May 30), honors the war "
    "dead. Unofficially, the day honors the start of summer. (More on that in a moment.)\n\n\n\n"
    "After World War I, the observances were widened to honor the fallen from all American wars--and in "
    "1971, Congress declared Memorial Day a national holiday.\n"
)


def values(output: str) -> dict[str, float]:
    """The `label   0.123456` rows of `compare`."""
    found = {}
    for line in output.splitlines():
        match = re.match(r"^(.*?)\s+(\d+\.\d{6})$", line)
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


def test_compare_prints_the_measures(tmp_path: Path, prose: tuple[str, ...], capsys) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(prose[0], encoding="utf-8")
    b.write_text("By Staff Writer\n\n" + prose[0].upper() + "\nAll rights reserved.", encoding="utf-8")
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    rows = values(out)
    assert f"A={a}" in out and f"B={b}" in out
    normalized = rows["jaccard, normalized 5-shingles"]
    assert 0.8 < normalized < 1.0
    assert rows["jaccard, raw 5-shingles"] < 0.1  # upper-cased: raw shingles differ
    assert rows["minhash estimate (128 slots)"] == pytest.approx(normalized, abs=0.15)
    assert rows["containment of A in B"] == 1.0
    assert rows["containment of B in A"] < 1.0
    assert 0.0 <= rows["4-character block similarity"] < 0.2


def test_compare_identical_files(tmp_path: Path, prose: tuple[str, ...], capsys) -> None:
    a = tmp_path / "a.txt"
    a.write_text(prose[1], encoding="utf-8")
    assert cli.main(["compare", str(a), str(a), "-k", "7", "--num-perm", "64", "--seed", "3"]) == 0
    rows = values(capsys.readouterr().out)
    assert len(rows) == 6 and set(rows.values()) == {1.0}
    assert "jaccard, normalized 7-shingles" in rows and "minhash estimate (64 slots)" in rows


def test_compare_seed_004_a_and_b(tmp_path: Path, capsys) -> None:
    lines = ["23l4kj23 klgjdlskgj235 3lkj 0952ru lkfj lkqejfg", "2t34lktj3409t uj34gjklejeglekjfdklsafjalsfj"]
    tail = "sdgakdgjsdalgjaslfjsalkfjsadlf"
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes("\n".join([*lines, "A" * 48, tail, ""]).encode())
    b.write_bytes("\n".join([*lines, "A" * 49, tail, ""]).encode())
    assert cli.main(["compare", str(a), str(b)]) == 0
    assert values(capsys.readouterr().out)["4-character block similarity"] == round(35 / 44, 6)


def test_compare_legacy_encoded_files(tmp_path: Path, capsys) -> None:
    one, two = tmp_path / "1.txt", tmp_path / "2.txt"
    one.write_bytes(SEED_004_1_TXT.encode("iso-8859-14"))
    two.write_bytes(SEED_004_2_TXT.encode("utf-8"))
    with pytest.raises(UnicodeDecodeError):
        one.read_bytes().decode("utf-8")
    assert cli.main(["compare", str(one), str(two)]) == 0
    captured = capsys.readouterr()
    assert f"note: {one} is not UTF-8" in captured.err
    assert str(two) not in captured.err
    rows = values(captured.out)
    assert len(rows) == 6
    assert rows["jaccard, normalized 5-shingles"] < 0.2  # unrelated stories
    assert cli.main(["compare", str(one), str(one)]) == 0
    assert values(capsys.readouterr().out)["jaccard, normalized 5-shingles"] == 1.0


def test_tune_prints_banding_and_draws_the_s_curve(tmp_path: Path, capsys) -> None:
    png = tmp_path / "x.png"
    assert cli.main(["tune", "--threshold", "0.8", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    expected = optimal_params(0.8, 128, 0.5)
    assert f"bands={expected.bands} rows={expected.rows}" in out
    assert f"S-curve written to {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5000
    probabilities = [float(x) for x in re.findall(r"^\s+\d\.\d\d\s+(\d\.\d+)$", out, re.M)]
    assert len(probabilities) == 13 and probabilities == sorted(probabilities)


def test_tune_with_explicit_banding(capsys) -> None:
    assert cli.main(["tune", "--threshold", "0.5", "--bands", "16", "--rows", "8"]) == 0
    assert "bands=16 rows=8 (uses 128 slots)" in capsys.readouterr().out


def test_evaluate_prints_the_confusion_counts(tmp_path: Path, prose: tuple[str, ...], capsys) -> None:
    records = []
    for i, text in enumerate(prose):
        records.append({"id": f"orig-{i}", "text": text})
        records.append({"id": f"copy-{i}", "text": f"Reporting by staff. {text} (c) 2011 Wire Service."})
        records.append({"id": f"head-{i}", "text": text[: len(text) // 2]})
    source = tmp_path / "set.jsonl"
    source.write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n{broken\n")
    assert cli.main(["evaluate", str(source), "--samples", "2"]) == 0
    out = capsys.readouterr().out
    n = len(records)
    assert f"articles={n} pairs={n * (n - 1) // 2}" in out
    row = re.search(r"all pairs\s+TP=(\d+)\s+FP=(\d+)\s+FN=(\d+)\s+TN=(\d+)", out)
    assert row is not None
    tp, fp, fn, tn = map(int, row.groups())
    assert tp + fp + fn + tn == n * (n - 1) // 2
    assert tp == len(prose)  # each original with its syndicated copy
    assert fp == 0 and fn == 0
    assert "LSH candidate recall on true pairs: 5/5" in out
    assert out.count("top-3 earlier articles most similar to") == 2


def subcommands() -> list[str]:
    parser = cli.build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(actions[0].choices)


def test_the_embedded_commands_exist() -> None:
    assert {"compare", "tune", "dedup", "evaluate"} <= set(subcommands())


@pytest.mark.parametrize("command", [None, *subcommands()])
def test_every_command_has_help(command: str | None, capsys) -> None:
    argv = ["--help"] if command is None else [command, "--help"]
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 0
    assert "usage: neardup" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "path"),
    [
        (["dedup", "{missing}", "-o", "{tmp}/out.jsonl"], "{missing}"),
        (["dedup", "{given}", "-o", "{missing}/out.jsonl"], "{missing}/out.jsonl"),
        (["compare", "{missing}", "{given}"], "{missing}"),
        (["evaluate", "{tmp}"], "{tmp}"),
    ],
    ids=["dedup-input", "dedup-output-directory", "compare", "evaluate-a-directory"],
)
def test_a_path_that_cannot_be_read_or_written_is_said_in_one_line(
    argv: list[str], path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = tmp_path / "in.jsonl"
    given.write_text('{"id": "a", "text": "a short text"}\n')
    names = {"missing": str(tmp_path / "missing"), "tmp": str(tmp_path), "given": str(given)}
    assert cli.main([arg.format(**names) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path.format(**names)}: ") and err.count("\n") == 1
    assert "Traceback" not in err


def test_unknown_command_is_an_error(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["no-such-command"])
    assert info.value.code == 2


def test_evaluate_credits_an_exact_copy_through_its_content_holder(prose: tuple[str, ...]) -> None:
    """The index keeps exact copies out of its buckets (their content's holder stands for them):
    a later near copy is a candidate pair with the copy too, with the holder's estimate."""
    from neardup.core.params import DedupParams
    from neardup.evaluation import evaluate
    from neardup.messages import Article

    articles = [
        Article("a", prose[0]),
        Article("a-copy", prose[0]),
        Article("b", prose[0] + " Reporting by the wire desk."),
        Article("other", prose[2]),
    ]
    result = evaluate(articles, DedupParams(), sample_size=0)
    assert result.true_pairs == 3  # (a-copy, a), (b, a), (b, a-copy)
    assert result.candidates_found == 3 and result.represented == 1
    assert result.all_pairs.tp == 3 and result.all_pairs.fn == 0


def test_evaluate_decides_and_applies_through_the_engine(
    tmp_path: Path, prose: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The evaluation measures the engine that embedded mode and the worker run, not a copy of it."""
    from neardup.pipeline import shard

    indexed: list[str] = []
    real = shard.IndexShard.decide

    def recorded(self: shard.IndexShard, items: Any, *args: Any, **kwargs: Any) -> Any:
        indexed.extend(item.article_id for item in items)
        return real(self, items, *args, **kwargs)

    monkeypatch.setattr(shard.IndexShard, "decide", recorded)
    source = tmp_path / "set.jsonl"
    records = [{"id": f"a{i}", "text": text} for i, text in enumerate(prose)]
    source.write_bytes(b"\n".join(orjson.dumps(r) for r in records) + b"\n")
    assert cli.main(["evaluate", str(source), "--samples", "0"]) == 0
    assert indexed == [r["id"] for r in records]
    assert f"articles={len(records)}" in capsys.readouterr().out
