"""A plain `pip install` of a fresh copy of the checkout into a new virtual environment: the package
imports as neardup with its compiled modules and data, not as service; the README's library example
runs there; the `neardup` command starts. No broker needed; pip downloads what its cache lacks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_readme import library_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
# What a fresh clone does not have: local environments, caches, build output, built extensions.
NOT_IN_A_CLONE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".*_cache", ".kafka"
)


def run(args: list[str | Path], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # without the caller's PYTHONPATH and virtual environment, so that only the new one is seen
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_pip_install_into_a_fresh_venv(tmp_path: Path) -> None:
    source, venv, work = tmp_path / "neardup", tmp_path / "venv", tmp_path / "work"
    shutil.copytree(REPO, source, ignore=NOT_IN_A_CLONE)
    work.mkdir()
    created = run([sys.executable, "-m", "venv", venv], cwd=work)
    assert created.returncode == 0, created.stderr
    python, bin_dir = venv / "bin" / "python", venv / "bin"

    installed = run([python, "-m", "pip", "install", "--disable-pip-version-check", source], work, 1500)
    assert installed.returncode == 0, installed.stdout[-4000:] + installed.stderr[-4000:]

    # from an unrelated directory: the installed package, not the checkout's folder
    check = (
        "import importlib.resources, pathlib, sys, neardup\n"
        "import neardup.core._sketch, neardup.stream._kafka_hash\n"
        "from neardup.core import compiled\n"
        "assert compiled.BUILT\n"
        "assert pathlib.Path(neardup.__file__).is_relative_to(sys.prefix), neardup.__file__\n"
        "data = importlib.resources.files('neardup') / 'data'\n"
        "assert (data / 'sample_news.jsonl').is_file() and (data / 'prefix_reference.json').is_file()\n"
        "with neardup.open() as dedup:\n"
        "    print(dedup.check({'id': 'a', 'text': 'Installed and deciding.'})['verdict'])\n"
    )
    imported = run([python, "-c", check], work)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout == "unique\n"
    old_name = run([python, "-c", "import service"], work)
    assert "No module named 'service'" in old_name.stderr

    code, output = library_example()
    example = run([python, "-c", code], work)
    assert example.returncode == 0, example.stderr
    assert example.stdout == output

    for command in ([bin_dir / "neardup", "--help"], [python, "-m", "neardup", "--help"]):
        helped = run(command, work)
        assert helped.returncode == 0, helped.stderr
        assert "usage: neardup" in helped.stdout and "dedup" in helped.stdout and "worker" in helped.stdout

    # the bundled sample, from the installed package data, through the embedded mode
    where = run([python, "-c", "import importlib.resources as r; print(r.files('neardup') / 'data')"], work)
    sample = Path(where.stdout.strip()) / "sample_news.jsonl"
    dedup = run([bin_dir / "neardup", "dedup", sample, "-o", work / "verdicts.jsonl", "-q"], work)
    assert dedup.returncode == 0, dedup.stderr
    assert "articles=489" in dedup.stdout and "duplicate=" in dedup.stdout
