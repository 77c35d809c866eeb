"""The settings table (neardup.config.SETTINGS) and the modes made from it agree: every setting a
mode applies to is taken by that mode under its documented name and with the one default; the
settings that change verdicts are taken by every mode (or refused by one in the table's words),
reach the engine alike, and a value out of bounds is refused in the same words everywhere."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

import neardup
from neardup import cli, evaluation
from neardup.config import (
    ALL_MODES,
    BOOL,
    BY_NAME,
    SETTINGS,
    ConfigError,
    FlagSet,
    Mode,
    Settings,
    engine_params,
    for_mode,
    keyword_values,
    retention_window,
)
from neardup.core.params import DedupParams
from neardup.core.retention import Retention
from neardup.stream.commands import WORKER_FLAGS, worker_settings

SAMPLE = Path(neardup.__file__).parent / "data" / "sample_news.jsonl"
CONFIGURATION = Path(__file__).resolve().parents[2] / "deploy" / "docs" / "configuration.md"
VERDICTS = [setting for setting in SETTINGS if setting.changes_verdicts]
SHARED = [setting for setting in SETTINGS if len(setting.modes) > 1]
# A value other than the default for each setting more than one mode takes, as a variable or a
# flag writes it and as a keyword gives it; together they are one valid configuration.
OTHER = {
    "unique_filter": ("unique,partial", "unique,partial"),
    "max_text_bytes": ("5000", 5000),
    "threshold": ("0.7", 0.7),
    "containment_threshold": ("0.85", 0.85),
    "revised_threshold": ("0.4", 0.4),
    "containment_index": ("false", False),
    "lsh_threshold": ("0.4", 0.4),
    "fn_weight": ("0.3", 0.3),
    "bands": ("8", 8),
    "rows": ("8", 8),
    "num_perm": ("64", 64),
    "verify_perm": ("256", 256),
    "shingle_size": ("7", 7),
    "word_shingles": ("true", True),
    "normalize_nfkc": ("false", False),
    "normalize_casefold": ("false", False),
    "normalize_whitespace": ("false", False),
    "seed": ("9", 9),
    "top_candidates": ("5", 5),
    "max_candidates": ("50", 50),
    "bucket_cap": ("16", 16),
    "retention": ("30d", "30d"),
    "time_skew": ("5m", "5m"),
    "min_event_time": ("1900-01-01T00:00:00Z", "1900-01-01T00:00:00Z"),
}
# A value out of bounds (or of the wrong type) for each setting that changes verdicts.
WRONG = {
    "max_text_bytes": ("0", 0),
    "threshold": ("1.5", 1.5),
    "containment_threshold": ("2", 2.0),
    "revised_threshold": ("2", 2.0),
    "containment_index": ("maybe", "maybe"),
    "lsh_threshold": ("1", 1.0),
    "fn_weight": ("2", 2.0),
    "bands": ("0", 0),
    "rows": ("0", 0),
    "num_perm": ("many", "many"),
    "verify_perm": ("100", 100),
    "shingle_size": ("65", 65),
    "word_shingles": ("maybe", "maybe"),
    "normalize_nfkc": ("maybe", "maybe"),
    "normalize_casefold": ("maybe", "maybe"),
    "normalize_whitespace": ("maybe", "maybe"),
    "seed": ("-1", -1),
    "top_candidates": ("0", 0),
    "max_candidates": ("0", 0),
    "bucket_cap": ("0", 0),
    "retention": ("a month", "a month"),
    "time_skew": ("-5m", "-5m"),
    "min_event_time": ("1900-01-01", "1900-01-01"),
}


@pytest.fixture(autouse=True)
def no_settings_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for setting in SETTINGS:
        monkeypatch.delenv(setting.env, raising=False)


def flag_argv(name: str, text: str) -> list[str]:
    setting = BY_NAME[name]
    if setting.kind is BOOL:
        return [setting.flag if text == "true" else f"--no-{setting.flag[2:]}"]
    return [setting.flag, text]


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


def dedup_argv(*more: str) -> list[str]:
    return ["dedup", "in.jsonl", "-o", "out.jsonl", *more]


# -- the table itself --------------------------------------------------------------------------


def test_names_variables_and_flags_are_unique() -> None:
    assert len(BY_NAME) == len(SETTINGS)
    assert len({setting.env for setting in SETTINGS}) == len(SETTINGS)
    flags = [flag for setting in SETTINGS for flag in setting.flags]
    assert len(set(flags)) == len(flags)
    assert all(setting.modes for setting in SETTINGS)


@pytest.mark.parametrize("setting", VERDICTS, ids=lambda s: s.name)
def test_a_setting_that_changes_verdicts_applies_to_every_mode_or_is_refused(setting: Any) -> None:
    assert setting.flags, "settable by a flag wherever a command decides"
    assert set(setting.refused) == ALL_MODES - setting.modes
    assert all(reason for reason in setting.refused.values())
    assert OTHER.keys() >= {setting.name} and WRONG.keys() >= {setting.name}


def test_every_setting_of_the_commands_has_a_flag() -> None:
    for mode in (Mode.DEDUP, Mode.EVALUATE):
        assert all(setting.flags for setting in for_mode(mode)), mode


def settings_in_help(command: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The settings a command's --help lists in its settings group, by their flags, in order."""
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    lines = capsys.readouterr().out.partition("\nsettings (")[2].splitlines()[1:]
    group = lines[: next((i for i, line in enumerate(lines) if line[:1] not in ("", " ")), len(lines))]
    by_flag = {flag: setting.name for setting in SETTINGS for flag in setting.flags}
    return [by_flag[line.split()[0].rstrip(",")] for line in group if line.startswith("  -")]


def test_every_setting_is_made_from_its_one_declaration(capsys: pytest.CaptureFixture[str]) -> None:
    """Each field of Settings declares a setting; the table, each command's flags, the library's
    keywords and configuration.md's rows are made from the fields, so a setting declared is in
    each of them, once, and none is in one of them alone."""
    declared = [f.name for f in dataclasses.fields(Settings)]
    assert [setting.name for setting in SETTINGS] == declared
    hidden = [f.name for f in dataclasses.fields(Settings) if not f.repr]
    assert hidden == [s.name for s in SETTINGS if s.secret] == ["sasl_password"]
    rows = re.findall(r"^\| `(NEARDUP_\w+)` \|", CONFIGURATION.read_text(encoding="utf-8"), re.MULTILINE)
    assert rows == [f"NEARDUP_{name.upper()}" for name in declared]
    library = list(inspect.signature(neardup.open).parameters)
    assert library == ["state_dir", *(s.name for s in for_mode(Mode.LIBRARY))]
    listed: set[str] = set()
    for mode in (Mode.WORKER, Mode.DEDUP, Mode.EVALUATE):
        flags = settings_in_help(mode.value, capsys)
        assert flags == [s.name for s in for_mode(mode) if s.flags], mode
        listed |= set(flags)
    for command, flag_set in (("tune", cli.TUNE_FLAGS), ("compare", cli.COMPARE_FLAGS)):
        assert settings_in_help(command, capsys) == [s.name for s in flag_set.settings]
    assert listed == {s.name for s in SETTINGS if s.flags}, "a flag no command takes"


# -- one default -------------------------------------------------------------------------------


def test_every_mode_has_the_tables_defaults() -> None:
    worker = worker_settings(parse("worker"))
    dedup = cli.DEDUP_FLAGS.resolve(parse(*dedup_argv()), {})
    evaluate = cli.EVALUATE_FLAGS.resolve(parse("evaluate", "in.jsonl"), {})
    library = inspect.signature(neardup.open).parameters
    for setting in SETTINGS:
        if Mode.WORKER in setting.modes:
            assert getattr(worker, setting.name) == setting.default, setting.name
        if Mode.DEDUP in setting.modes:
            assert dedup[setting.name] == setting.default, setting.name
        if Mode.EVALUATE in setting.modes:
            assert evaluate[setting.name] == setting.default, setting.name
        if Mode.LIBRARY in setting.modes:
            assert library[setting.name].default == setting.default, setting.name
            assert library[setting.name].kind is inspect.Parameter.KEYWORD_ONLY
    assert set(dedup) == {s.name for s in for_mode(Mode.DEDUP)}
    assert set(evaluate) == {s.name for s in for_mode(Mode.EVALUATE)}
    assert set(library) == {"state_dir"} | {s.name for s in for_mode(Mode.LIBRARY)}
    assert keyword_values({}) == {s.name: s.default for s in for_mode(Mode.LIBRARY)}


# -- every mode takes its settings under their documented names ----------------------------------


@pytest.mark.parametrize("setting", SHARED, ids=lambda s: s.name)
def test_every_mode_takes_the_setting_under_its_name(setting: Any) -> None:
    text, value = OTHER[setting.name]
    assert value != setting.default
    flag = flag_argv(setting.name, text)
    flags = {
        Mode.WORKER: (WORKER_FLAGS, ["worker"]),
        Mode.DEDUP: (cli.DEDUP_FLAGS, dedup_argv()),
        Mode.EVALUATE: (cli.EVALUATE_FLAGS, ["evaluate", "in.jsonl"]),
    }
    for mode in setting.modes - {Mode.LIBRARY}:
        flag_set, argv = flags[mode]
        assert flag_set.resolve(parse(*argv, *flag), {})[setting.name] == value, (mode, "flag")
        assert flag_set.resolve(parse(*argv), {setting.env: text})[setting.name] == value, (mode, "env")
    if Mode.WORKER in setting.modes:  # the worker checks the whole: a banding needs both halves
        partner = {"bands": "rows", "rows": "bands"}.get(setting.name)
        env = {setting.env: text} | ({BY_NAME[partner].env: OTHER[partner][0]} if partner else {})
        more = flag_argv(partner, OTHER[partner][0]) if partner else []
        assert getattr(Settings.from_env(env), setting.name) == value
        assert getattr(worker_settings(parse("worker", *flag, *more)), setting.name) == value
    if Mode.LIBRARY in setting.modes:
        assert keyword_values({setting.name: value})[setting.name] == value


def test_a_flag_wins_over_its_variable() -> None:
    environ = {"NEARDUP_THRESHOLD": "0.6", "NEARDUP_NUM_PERM": "64"}
    values = cli.DEDUP_FLAGS.resolve(parse(*dedup_argv("--threshold", "0.7")), environ)
    assert (values["threshold"], values["num_perm"]) == (0.7, 64)


def all_other(mode: Mode) -> dict[str, tuple[str, Any]]:
    return {name: OTHER[name] for name in OTHER if mode in BY_NAME[name].modes}


def test_the_same_settings_reach_the_same_engine_in_every_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything set at once, each mode its own way: the same engine parameters, window, cap."""
    expected = engine_params({name: value for name, (_, value) in OTHER.items()})
    assert expected != DedupParams()
    made: dict[str, tuple[DedupParams, dict[str, Any]]] = {}
    for mode, flag_set, argv in (
        (Mode.DEDUP, cli.DEDUP_FLAGS, dedup_argv()),
        (Mode.EVALUATE, cli.EVALUATE_FLAGS, ["evaluate", "in.jsonl"]),
        (Mode.WORKER, WORKER_FLAGS, ["worker"]),
    ):
        others = all_other(mode)
        flags = [part for name, (text, _) in others.items() for part in flag_argv(name, text)]
        by_flag = flag_set.resolve(parse(*argv, *flags), {})
        by_env = flag_set.resolve(parse(*argv), {BY_NAME[n].env: text for n, (text, _) in others.items()})
        assert by_flag == by_env
        made[mode.value] = engine_params(by_flag), by_flag
    worker = Settings.from_env({BY_NAME[n].env: text for n, (text, _) in all_other(Mode.WORKER).items()})
    made["worker env"] = worker.params(), vars(worker)
    library = keyword_values({n: value for n, (_, value) in all_other(Mode.LIBRARY).items()})
    made["library"] = engine_params(library), library
    for where, (params, values) in made.items():
        assert params == expected, where
        assert (values["bucket_cap"], values["max_text_bytes"]) == (16, 5000), where
        if "retention" in values:
            assert retention_window(values) == Retention(30 * 86_400_000, 300_000, -2_208_988_800_000), where


def test_the_commands_and_the_library_run_with_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """End to end: `neardup dedup` with every flag and neardup.open with every keyword give the
    same verdicts; `neardup evaluate` evaluates the same engine."""
    lines = SAMPLE.read_bytes().splitlines()[:60]
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    not_evaluated = ("unique_filter", "retention", "time_skew", "min_event_time")
    others = {n: OTHER[n] for n in OTHER if n not in not_evaluated}
    flags = [part for name, (text, _) in others.items() for part in flag_argv(name, text)]
    assert cli.main(["dedup", str(source), "-o", str(out), "-q", *flags]) == 0
    from_cli = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    with neardup.open(**{name: value for name, (_, value) in others.items()}) as dedup:
        from_library = list(dedup.check_many(lines))
        assert dedup.params == engine_params({name: value for name, (_, value) in others.items()})
    assert from_cli == from_library and len(from_cli) == len(lines)
    assert from_cli[0]["params"]["num_perm"] == 64 and from_cli[0]["params"]["unit"] == "word"

    seen: list[tuple[DedupParams, int]] = []
    real = evaluation.evaluate

    def recorded(articles: Any, params: DedupParams, **kwargs: Any) -> Any:
        seen.append((params, kwargs["bucket_cap"]))
        return real(articles, params, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", recorded)
    assert cli.main(["evaluate", str(source), "--samples", "0", *flags]) == 0
    assert seen == [(dedup.params, 16)]
    assert "bands=8 rows=8" in capsys.readouterr().out


# -- refused in the same words -----------------------------------------------------------------


def refusals(name: str, text: str, value: Any, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """How each mode refuses the value, with the setting's name as that mode spells it (and the
    name the engine's own messages use) written <>."""
    setting = BY_NAME[name]
    found: dict[str, str] = {}

    def words(message: str, spelling: str) -> str:
        return message.replace(spelling, "<>").replace(name, "<>")

    def cli_error(argv: list[str], environ: dict[str, str] | None = None) -> str:
        with pytest.MonkeyPatch.context() as patch:
            for variable, raw in (environ or {}).items():
                patch.setenv(variable, raw)
            assert cli.main(argv) == 2, argv
        return capsys.readouterr().err.strip().removeprefix("error: ")

    dedup = ["dedup", str(SAMPLE), "-o", "unused.jsonl", "-q"]
    with pytest.raises(ConfigError) as info:
        Settings.from_env({setting.env: text})
    found["worker env"] = words(str(info.value), setting.env)
    found["dedup env"] = words(cli_error(dedup, {setting.env: text}), setting.env)
    if Mode.EVALUATE in setting.modes:
        found["evaluate env"] = words(cli_error(["evaluate", str(SAMPLE)], {setting.env: text}), setting.env)
    if setting.kind is not BOOL:  # a boolean flag takes no value: --x or --no-x
        flag = f"{setting.flag}={text}"
        with pytest.raises(SystemExit) as exited:
            worker_settings(parse("worker", flag))
        found["worker flag"] = words(
            str(exited.value.code).removeprefix("configuration error: "), setting.flag
        )
        found["dedup flag"] = words(cli_error([*dedup, flag]), setting.flag)
        if Mode.EVALUATE in setting.modes:
            found["evaluate flag"] = words(cli_error(["evaluate", str(SAMPLE), flag]), setting.flag)
    with pytest.raises(ConfigError) as info:
        neardup.open(**{name: value})
    found["library"] = words(str(info.value), name)
    return found


@pytest.mark.parametrize("setting", VERDICTS, ids=lambda s: s.name)
def test_a_value_out_of_bounds_is_refused_in_the_same_words_in_every_mode(
    setting: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    text, value = WRONG[setting.name]
    found = refusals(setting.name, text, value, capsys)
    assert len(set(found.values())) == 1, found
    assert "Traceback" not in next(iter(found.values()))
    assert not Path("unused.jsonl").exists()


@pytest.mark.parametrize("setting", [s for s in VERDICTS if s.refused], ids=lambda s: s.name)
def test_a_mode_refuses_a_setting_in_the_tables_words(
    setting: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for mode, reason in setting.refused.items():
        assert mode is Mode.EVALUATE  # the only command that judges articles without their times
        text, _ = OTHER[setting.name]
        assert cli.main(["evaluate", str(SAMPLE), setting.flag, text]) == 2
        error = capsys.readouterr().err.strip()
        assert error == f"error: {setting.flag} does not apply to `neardup evaluate`: {reason}"
    with pytest.raises(SystemExit):
        cli.main(["evaluate", "--help"])
    assert setting.flag not in capsys.readouterr().out, "hidden from --help"


def test_the_library_names_an_unknown_keyword() -> None:
    with pytest.raises(TypeError, match=r"has no setting 'threshhold' \(did you mean threshold\?\)"):
        neardup.open(threshhold=0.9)
    with pytest.raises(TypeError, match="did you mean fn_weight"):
        neardup.open(false_negative_weight=0.9)
    with pytest.raises(TypeError, match=r"sign_batch does not apply to neardup\.open\(\)"):
        neardup.open(sign_batch=5)


def test_a_setting_the_worker_alone_takes_is_not_a_flag_of_dedup(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(dedup_argv("--metrics-port", "1"))
    assert "unrecognized arguments: --metrics-port" in capsys.readouterr().err


def test_flag_sets_made_by_name_read_no_variables_unless_asked() -> None:
    tune = FlagSet.named("threshold", env=False)
    args = argparse.Namespace()
    assert tune.resolve(args, {"NEARDUP_THRESHOLD": "0.5"}) == {"threshold": 0.8}
    assert FlagSet.named("threshold").resolve(args, {"NEARDUP_THRESHOLD": "0.5"}) == {"threshold": 0.5}
