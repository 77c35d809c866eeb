"""A fresh clone of the repository, as a new user gets it: `pip install .` into a new virtual
environment imports as neardup with its compiled modules and data, not as service; the README's
library example runs there; the `neardup` command starts. And the README's first command,
`deploy/demo.sh`, runs there end to end. No broker needed but the demo's own; pip downloads what its
cache lacks."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from tests.support.broker import free_port, free_port_pair
from tests.support.readme import library_example

pytestmark = [pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
# What a fresh clone does not have, for a source that is not a git checkout (an unpacked archive):
# local environments, caches, build output, built extensions.
NOT_IN_A_CLONE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".*_cache", ".kafka"
)


def clean_env(**more: str) -> dict[str, str]:
    """The caller's environment without its Python path, virtual environment, git repository and
    neardup settings; of the broker script's own (NEARDUP_KAFKA_*), those that say where its jars
    are and how it runs stay (the jar cache is shared), not those that say where it listens."""
    mine = ("NEARDUP_KAFKA_PORT", "NEARDUP_KAFKA_CONTROLLER_PORT", "NEARDUP_KAFKA_DIR")

    def kept(name: str) -> bool:
        if name in ("PYTHONPATH", "VIRTUAL_ENV", *mine) or name.startswith("GIT_"):
            return False
        return not name.startswith("NEARDUP_") or name.startswith("NEARDUP_KAFKA_")

    return {**{k: v for k, v in os.environ.items() if kept(k)}, **more}


def run(args: list[str | Path], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # without the caller's PYTHONPATH and virtual environment, so that only the new one is seen
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )


def fresh_clone(target: Path) -> Path:
    """The repository as a clone gets it: what is committed at this checkout's HEAD, and nothing
    else (an untracked or uncommitted file stays behind). Copied, without what a clone lacks, only
    where the source is not a git checkout."""
    if not (REPO / ".git").exists():
        shutil.copytree(REPO, target, ignore=NOT_IN_A_CLONE)
        return target
    head = run(["git", "rev-parse", "HEAD"], REPO)
    assert head.returncode == 0, head.stderr
    for command in (
        ["git", "clone", "--quiet", "--no-checkout", REPO, target],
        ["git", "-C", target, "checkout", "--quiet", "--detach", head.stdout.strip()],
    ):
        done = run(command, REPO)
        assert done.returncode == 0, done.stderr
    return target


@pytest.mark.budget(30)  # builds the package: the compiled modules, a wheel
def test_pip_install_into_a_fresh_venv(tmp_path: Path) -> None:
    source, venv, work = tmp_path / "neardup", tmp_path / "venv", tmp_path / "work"
    fresh_clone(source)
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

    code, output = library_example((source / "README.md").read_text())
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


SUMMARY = re.compile(
    r"^verdicts: (\d+) \(unique=(\d+), duplicate=(\d+), partial=(\d+), revised=(\d+); "
    r"exact re-posts=(\d+)\)$",
    re.M,
)


@pytest.mark.budget(40)  # installs the clone, starts a broker of its own, then the demo
def test_the_readme_demo_runs_in_a_fresh_clone(tmp_path: Path) -> None:
    """The README's first command, in a fresh clone: it installs into the clone's .venv, starts a
    broker and the worker, sends the bundled sample and prints a verdict for every article, with
    the counts the embedded mode gives for the same sample. On ports of its own (the demo's
    defaults may be taken by another run on this machine), its broker's data in tmp_path."""
    source = fresh_clone(tmp_path / "neardup")
    readme = (source / "README.md").read_text()
    first = re.search(r"```sh\n(.*?)```", readme, flags=re.S)
    assert first is not None and first.group(1).strip() == "deploy/demo.sh", "the README's first command"
    port = free_port_pair()
    env = clean_env(
        NEARDUP_DEMO_PORT=str(port),
        NEARDUP_DEMO_METRICS_PORT=str(free_port()),
        NEARDUP_KAFKA_DIR=str(tmp_path / "kafka"),
        TMPDIR=str(tmp_path),
    )
    demo = subprocess.Popen(
        ["deploy/demo.sh"],
        cwd=source,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = demo.communicate(timeout=1500)
    finally:
        if demo.poll() is None:  # timed out: its worker and broker go with it
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        kafka = source / "deploy" / "kafka" / "kafka.sh"
        stop_env = {**env, "NEARDUP_KAFKA_PORT": str(port)}
        subprocess.run([kafka, "stop", "--wipe"], env=stop_env, capture_output=True, check=False)
    assert demo.returncode == 0, output[-6000:]

    sample = source / "service" / "data" / "sample_news.jsonl"
    total = sum(1 for line in sample.read_bytes().splitlines() if line.strip())
    assert f"== sending {total} articles" in output, output[-6000:]
    summary = SUMMARY.search(output)
    assert summary is not None, output[-6000:]
    shown = [
        line for line in output.splitlines() if re.match(r"^\S+\s+(unique|duplicate|partial|revised)\b", line)
    ]
    assert len(shown) == 25, output[-6000:]  # the first verdicts as they arrive

    # the same sample through the embedded mode, with what the demo installed
    verdicts = source / "embedded.jsonl"
    dedup = run([source / ".venv" / "bin" / "neardup", "dedup", sample, "-o", verdicts, "-q"], source)
    assert dedup.returncode == 0, dedup.stderr
    expected = [orjson.loads(line) for line in verdicts.read_bytes().splitlines()]
    kinds = Counter(v["verdict"] for v in expected)
    exact = sum(1 for v in expected if v["exact"])
    counts = (total, kinds["unique"], kinds["duplicate"], kinds["partial"], kinds["revised"], exact)
    assert tuple(map(int, summary.groups())) == counts, summary.group(0)
    print(summary.group(0))
