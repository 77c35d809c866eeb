"""The README's configuration table and command list cannot drift from the code, and the links of
the README, the deployment docs and the measurements resolve."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from neardup import settings_doc
from neardup.cli import build_parser
from neardup.config import BY_NAME, markdown, shown
from neardup.settings_doc import BEGIN, END, replaced
from tests.support.readme import library_example

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "deploy" / "docs" / "configuration.md").read_text()


def test_the_configuration_table_is_the_one_the_code_makes() -> None:
    """deploy/docs/configuration.md's table is service/config.py's, as `python -m
    neardup.settings_doc deploy/docs/configuration.md` writes it (run that after changing the table)."""
    assert CONFIGURATION.count(BEGIN) == 1 and CONFIGURATION.count(END) == 1
    assert replaced(CONFIGURATION, markdown()) == CONFIGURATION


def test_the_settings_doc_rewrites_a_stale_table(tmp_path: Path) -> None:
    doc = tmp_path / "configuration.md"
    doc.write_text(f"# Settings\n\n{BEGIN}| stale |\n{END}\nMore.\n")
    assert settings_doc.main([str(doc)]) == 0
    assert doc.read_text() == f"# Settings\n\n{BEGIN}{markdown()}{END}\nMore.\n"
    with pytest.raises(SystemExit):
        settings_doc.main([str(ROOT / "README.md")])  # no markers: refused, left alone


def test_the_readme_settings_have_the_tables_defaults() -> None:
    section = README.split("## Main settings", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (`NEARDUP_.*?) \| (.*?) \|", section, flags=re.M)
    assert len(rows) >= 5
    for names, defaults in rows:
        variables = re.findall(r"`NEARDUP_(\w+)`", names)
        written = re.findall(r"`([^`]*)`", defaults)
        assert len(variables) == len(written), names
        for variable, default in zip(variables, written, strict=True):
            setting = BY_NAME[variable.lower()]
            assert default == shown(setting.default), variable


def test_every_command_is_documented() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name in commands:
        assert f"`neardup {name}" in README, name


def test_the_library_example_prints_what_the_readme_says(tmp_path: Path) -> None:
    """Run as a script of its own in an empty directory (it creates its state directory there)."""
    code, output = library_example()
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == output
    assert (tmp_path / "dedup-state" / "CURRENT").exists()  # it did use the directory


def test_the_measurements_hold_the_present_only() -> None:
    """Each benchmark's current figure, not its history (that is in git): a page that stays short."""
    results = (ROOT / "tests" / "benchmarks" / "RESULTS.md").read_text()
    assert "## bench_stream.py" in results and len(results.encode()) <= 25 * 1024


def test_the_readme_is_a_page_to_start_from() -> None:
    """Short enough to read: details live in deploy/docs/, every link there resolves."""
    assert len(README.encode()) <= 10 * 1024
    for link in re.findall(r"\]\(((?:deploy|tests)/[^)#]+)\)", README):
        assert (ROOT / link).exists(), link


DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "deploy" / "docs").glob("*.md")),
    ROOT / "deploy" / "k8s" / "README.md",
    ROOT / "tests" / "benchmarks" / "RESULTS.md",
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """The anchors of a page's headings, as GitHub makes them."""
    headings = re.findall(r"^#{1,6} (.+?)\s*$", markdown, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_every_relative_link_in_the_deployment_docs_resolves(doc: Path) -> None:
    """Relative to the page: a file or folder that exists, and a heading of it where one is named."""
    text = doc.read_text()
    for link in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = doc.parent / path if path else doc
        assert target.exists(), f"{doc.relative_to(ROOT)}: {link}"
        if anchor and target.suffix == ".md":
            assert anchor in anchors(target.read_text()), f"{doc.relative_to(ROOT)}: {link}"
