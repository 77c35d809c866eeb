"""The README's configuration table and command list cannot drift from the code."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from neardup.cli import build_parser
from neardup.config import Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_setting_is_in_the_readme_table_with_its_default() -> None:
    rows = dict(re.findall(r"^\| `(NEARDUP_[A-Z_]+)` \|\s*`?([^|`]*?)`?\s*\|", README, flags=re.M))
    defaults = Settings()
    for spec in dataclasses.fields(Settings):
        name = f"NEARDUP_{spec.name.upper()}"
        assert name in rows, f"{name} missing from the README table"
        if spec.name != "sasl_password":
            assert rows[name].strip() == str(getattr(defaults, spec.name)), name
    assert set(rows) == {f"NEARDUP_{f.name.upper()}" for f in dataclasses.fields(Settings)}


def test_every_command_is_documented() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name in commands:
        assert f"`neardup {name}" in README, name
