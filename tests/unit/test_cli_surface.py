"""The command line and the configuration as users meet them, against snapshots in
tests/data/cli_surface/: every `neardup` command's --help (found by walking the parser, so a new
command is covered without a list to keep), deploy/docs/configuration.md, and the environment
variables the settings declare with their kinds and defaults. A change to any of them fails here
with its diff, so that none goes out unnoticed while the code under them is rewritten.

After an intended change, regenerate the snapshots and review their diff with the change:

    .venv/bin/python tests/unit/test_cli_surface.py --update

Help is rendered COLUMNS characters wide, whatever the terminal; the snapshots are argparse's
rendering under the project's Python (3.11), whose wording other versions change.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from neardup.cli import build_parser
from neardup.config import SETTINGS, shown

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "tests" / "data" / "cli_surface"
CONFIGURATION = ROOT / "deploy" / "docs" / "configuration.md"
COLUMNS = "100"
UPDATE = f"{Path(sys.executable).name} tests/unit/test_cli_surface.py --update"


def commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parser and every sub-command's, depth first, in the order they were added."""
    yield parser
    for action in parser._actions:  # argparse keeps sub-parsers there and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from commands(sub)


def surface() -> dict[str, str]:
    """Each snapshot's file name and the text it should hold now."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = COLUMNS  # what argparse's HelpFormatter reads its width from
    try:
        texts = {
            f"{parser.prog.replace(' ', '-')}.txt": parser.format_help()
            for parser in commands(build_parser())
        }
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    texts["configuration.md"] = CONFIGURATION.read_text(encoding="utf-8")
    texts["environment.txt"] = "".join(
        f"{setting.env} ({setting.kind.label}) = {shown(setting.default)}\n" for setting in SETTINGS
    )
    return texts


def differences(expected: dict[str, str], actual: dict[str, str]) -> str:
    """A unified diff per snapshot that differs, is missing or is no longer made."""
    out = []
    for name in sorted(expected.keys() | actual.keys()):
        before, after = expected.get(name), actual.get(name)
        if before == after:
            continue
        if before is None:
            out.append(f"{name}: new, no snapshot yet\n")
        elif after is None:
            out.append(f"{name}: a snapshot of something no longer there\n")
        else:
            diff = difflib.unified_diff(
                before.splitlines(keepends=True), after.splitlines(keepends=True), f"snapshot/{name}", name
            )
            out.append("".join(diff))
    return "\n".join(out)


def snapshots() -> dict[str, str]:
    return {path.name: path.read_text(encoding="utf-8") for path in sorted(SNAPSHOTS.iterdir())}


def test_commands_configuration_and_environment_match_their_snapshots() -> None:
    diff = differences(snapshots(), surface())
    if diff:
        pytest.fail(f"the CLI or configuration changed; if that is intended, run {UPDATE}\n\n{diff}", False)


def test_every_command_has_a_snapshot() -> None:
    """The walk finds the sub-commands (a parser whose sub-parsers it missed would pass unseen)."""
    names = set(surface())
    assert {"neardup.txt", "neardup-dedup.txt", "neardup-worker.txt", "configuration.md"} <= names
    assert len([name for name in names if name.startswith("neardup-")]) >= 8


def update() -> None:
    SNAPSHOTS.mkdir(parents=True, exist_ok=True)
    texts = surface()
    for path in SNAPSHOTS.iterdir():
        if path.name not in texts:
            path.unlink()
    for name, text in texts.items():
        (SNAPSHOTS / name).write_text(text, encoding="utf-8")
    print(f"{len(texts)} snapshots in {SNAPSHOTS.relative_to(ROOT)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        raise SystemExit(f"usage: {UPDATE}")
    update()
