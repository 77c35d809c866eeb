"""The import package is `neardup`, installed from the folder service/: the build lists every
subpackage, nothing in the repository imports or runs the old top-level name `service` (which would
collide with any other package of that name), and the installed package does not provide it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import neardup
from neardup.core import compiled

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# Ways of naming the package as a module, not as a folder (service/core/... is a path and stays):
# import statements, dotted module names, `python -m NAME` and its argument list form. The examples
# below spell the name through OLD, so that the rename command in the history leaves them alone.
OLD = "service"
OLD_NAME = re.compile(
    rf"\b(?:from|import) {OLD}\b(?=[ .,]|$)"
    rf"|\b{OLD}\.(?:core|state|stream|pipeline|cli|config|messages|embedded|evaluation|local_report|api)\b"
    rf"|-m\s+{OLD}\b(?![/\w])"
    rf'|"-m",\s*"{OLD}"',
    re.M,
)
SCANNED = ("service", "tests", "deploy", ".ci", "schemas", "README.md")
SKIPPED_SUFFIXES = {".json", ".jsonl", ".so", ".pyc", ".png"}


def scanned_files() -> list[Path]:
    files: list[Path] = []
    for root in SCANNED:
        path = REPO / root
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files.extend(
            p for p in candidates if p.suffix not in SKIPPED_SUFFIXES and "__pycache__" not in p.parts
        )
    return files


def test_the_build_lists_every_subpackage_of_the_folder() -> None:
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"neardup": "service"}
    folders = {
        ".".join(("neardup", *init.parent.relative_to(REPO / "service").parts))
        for init in (REPO / "service").rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == folders


def test_the_package_is_imported_from_the_service_folder() -> None:
    assert Path(neardup.__file__).resolve().parent == REPO / "service"
    assert compiled.__name__ == "neardup.core.compiled"


def test_no_file_names_the_old_top_level_package() -> None:
    files = scanned_files()
    assert any(p.name == "conftest.py" for p in files) and any(p.name == "asan" for p in files)
    offenders = [
        f"{p.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for p in files
        for text in [p.read_text(encoding="utf-8", errors="replace")]
        for m in OLD_NAME.finditer(text)
    ]
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize(
    "line",
    [
        f"from {OLD}.pipeline.shard import IndexShard",
        f"import {OLD}.core",
        f"import {OLD}, pytest",
        f'    subprocess.run([sys.executable, "-m", "{OLD}", "worker"])',
        f'[sys.executable, "-m",\n "{OLD}"]',
        f"python -m {OLD} dedup",
        f'Child.start("{OLD}.stream.signer", setup)',
    ],
)
def test_the_check_catches_the_old_name(line: str) -> None:
    assert OLD_NAME.search(line)


@pytest.mark.parametrize(
    "line", ["see service/core/_sketch.c", 'ROOT / "service" / "data"', "the service rejects it"]
)
def test_the_check_lets_the_folder_and_the_word_be(line: str) -> None:
    assert not OLD_NAME.search(line)


def test_the_installed_package_has_no_module_named_service(tmp_path: Path) -> None:
    """Run outside the checkout, where the folder itself is not on sys.path: only neardup is there."""
    run = subprocess.run(
        [sys.executable, "-c", f"import neardup.cli\nimport {OLD}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    assert f"No module named '{OLD}'" in run.stderr, run.stderr


def test_the_package_names_its_exports_without_importing_numpy() -> None:
    """`import neardup` is light (the command's entry sets numpy's threads before numpy is
    imported); each exported name is found when first used."""
    probe = (
        "import sys, neardup; print('numpy' in sys.modules); "
        "print(all(getattr(neardup, n) for n in neardup.__all__))"
    )
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert shown.stdout.split() == ["False", "True"]
    assert set(dir(neardup)) >= set(neardup.__all__)
    with pytest.raises(AttributeError):
        neardup.no_such_name  # noqa: B018


def test_a_dedup_run_in_process_imports_no_event_loop_or_encoding_detector(tmp_path: Path) -> None:
    """`neardup dedup` signing in its own process (a small input) starts without asyncio and
    charset_normalizer, which only helpers and a text not in UTF-8 need, nor socket and hashlib
    (a worker's instance id, an oversized dead letter); a text not in UTF-8 still finds its
    encoding."""
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"id": "a", "text": "A short article of plain prose."}\n')
    probe = (
        "import sys; from neardup.__main__ import main; "
        f"main(['dedup', {str(lines)!r}, '-o', {str(tmp_path / 'out.jsonl')!r}, '-q']); "
        "print(any(m in sys.modules for m in ('asyncio', 'socket', 'hashlib')), "
        "'charset_normalizer' in sys.modules); "
        "from neardup.core.normalize import decode_bytes; "
        "print(decode_bytes('Ça coûte très cher, déjà là-bas.'.encode('latin-1')).guessed)"
    )
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert shown.stdout.split()[-3:] == ["False", "False", "True"], shown.stdout + shown.stderr
