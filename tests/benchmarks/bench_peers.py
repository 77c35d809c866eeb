"""`neardup dedup` against the pipelines a user would write with rensa or datasketch.

Each engine runs as its own process over the same JSON-lines file, alternated, `--repeats` times,
a new state each time:

  * neardup: `neardup dedup IN -o OUT --state DIR -q` with the defaults, signing helper processes
    and the compaction at close included: this checkout's venv, or with `--commit REV` that
    commit's tree as committed (`git archive`) installed into a venv of its own under
    ~/.cache/neardup/bench-venvs/, for a working tree that holds changes not yet committed;
  * rensa: `peers/minhash_dedup.py rensa` (rensa 0.5.0, RMinHash 128 slots, RMinHashLSH 16 bands);
  * datasketch: `peers/minhash_dedup.py datasketch` (datasketch 2.0.0, MinHash / MinHashLSH), on the
    first `--datasketch-articles` articles when given (its figures then per article).

The two references run in a venv of their own, `peers/requirements.txt` installed (pinned) under
~/.cache/neardup/bench-venvs/, built on first use. Each run is timed from start-up to exit (wall),
and its CPU is the user+system time of every process it started: this process is their subreaper,
so a helper that outlives its parent is still waited for and counted, and the RUSAGE_CHILDREN delta
over the run covers all of them. A sampler reads /proc for the run's descendants as it goes, to show
that the helpers' CPU is in the total. Also `du -sb` of neardup's state directory after it closed,
per article, and how many verdicts (duplicate or not) neardup and rensa agree on.

Targets (issue 41, with the defaults): neardup's CPU at most 0.5x rensa's, its wall time at least
2x faster than rensa's and 10x faster than datasketch's; state at most 1,638 bytes an article.

Usage:
  .venv/bin/python tests/benchmarks/bench_peers.py [--input FILE | --articles N] [--repeats 3]
      [--datasketch-articles N | --no-datasketch] [--commit REV] [--neardup-flag=--no-containment-index]
      [--keep DIR]
  (the input defaults to the news corpus of tests/data/build_news_corpus.py, ~4,000 distinct
  articles; --articles N writes N of bench_stream.py's generator, 30% near-copies, instead)
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_state_size import write_input  # noqa: E402
from tests.benchmarks.bench_stream import CORPUS  # noqa: E402

PEERS = Path(__file__).resolve().parent / "peers"
REQUIREMENTS = PEERS / "requirements.txt"
VENVS = Path.home() / ".cache" / "neardup" / "bench-venvs"
CPU_TARGET = 0.5  # neardup's CPU / rensa's, at most
RENSA_SPEED_TARGET = 2.0  # rensa's wall / neardup's, at least
DATASKETCH_SPEED_TARGET = 10.0  # datasketch's wall / neardup's, per article, at least
STATE_TARGET = 1638  # bytes an article, at most
ORPHAN_WAIT_S = 30.0
TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# the peers' venv
# ---------------------------------------------------------------------------------------------


def peer_venv(override: Path | None) -> Path:
    """The references' python, in a venv named by the pinned requirements' digest (built once), so
    a change of pins builds a new one rather than running against stale packages."""
    if override is not None:
        return override / "bin" / "python"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    venv = VENVS / f"peers-{digest}"
    python, done = venv / "bin" / "python", venv / ".installed"
    if not done.exists():
        print(f"building {venv} from {REQUIREMENTS.relative_to(ROOT)}", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "--only-binary", ":all:", "-r", str(REQUIREMENTS)], check=True)
        done.write_text(REQUIREMENTS.read_text())
    return python


def neardup_build(commit: str) -> Path:
    """`neardup` of a commit as committed (`git archive`, installed into a venv of its own once),
    for a checkout whose working tree holds changes that are not the commit's."""
    sha = _git("rev-parse", "--verify", f"{commit}^{{commit}}")
    if not sha:
        raise SystemExit(f"{commit}: not a commit")
    home = VENVS / f"neardup-{sha[:12]}"
    tree, venv = home / "tree", home / "venv"
    done = home / ".installed"
    if not done.exists():
        print(f"building {home} from {sha[:12]}", flush=True)
        shutil.rmtree(home, ignore_errors=True)
        tree.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", sha], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, str(tree)], check=True)
        done.write_text(sha + "\n")
    return venv / "bin" / "neardup"


def versions(python: Path) -> str:
    code = (
        "import importlib.metadata as m, platform; "
        'print(f\'python {platform.python_version()}, rensa {m.version("rensa")}, '
        'datasketch {m.version("datasketch")}, numpy {m.version("numpy")}\')'
    )
    return subprocess.run(
        [str(python), "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


# ---------------------------------------------------------------------------------------------
# a measured run
# ---------------------------------------------------------------------------------------------


def become_subreaper() -> None:
    """Orphaned descendants of a run are handed to this process (not init), so they are waited for
    and their CPU reaches RUSAGE_CHILDREN."""
    PR_SET_CHILD_SUBREAPER = 36
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _own_cpu(pid: int) -> float | None:
    """A live process's own user+system seconds (its children's not included), from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


class Sampler(threading.Thread):
    """The last CPU seen in /proc of each process under `root`: a lower bound of what each used,
    to check the measured total against."""

    def __init__(self, root: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.seen: dict[int, float] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            pending = [self.root, *(pid for pid in self.seen if pid != self.root)]
            visited: set[int] = set()
            while pending:
                pid = pending.pop()
                if pid in visited:
                    continue
                visited.add(pid)
                cpu = _own_cpu(pid)
                if cpu is not None:
                    self.seen[pid] = max(cpu, self.seen.get(pid, 0.0))
                    pending.extend(_children(pid))
            self.stopping.wait(self.interval)


@dataclass
class Run:
    wall: float
    cpu: float  # every process of the run, user+system seconds
    main_seen: float  # the started process's own CPU, last seen in /proc
    others_seen: float  # its descendants', last seen in /proc
    processes: int  # processes seen


def measured(argv: list[str], log: Path) -> Run:
    """Run argv to its end and every process it left behind; wall time to the started process's
    exit, CPU from RUSAGE_CHILDREN over the whole run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    sampler = Sampler(process.pid)
    sampler.start()
    _, status, _ = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    sampler.stopping.set()
    sampler.join()
    deadline = time.monotonic() + ORPHAN_WAIT_S
    while True:  # descendants the run left behind, handed to this process
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{argv[:4]}: processes still running {ORPHAN_WAIT_S:.0f} s after it ended"
                )
            time.sleep(0.05)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {process.returncode}; see {log}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    main = sampler.seen.get(process.pid, 0.0)
    others = sum(cpu for pid, cpu in sampler.seen.items() if pid != process.pid)
    return Run(wall, cpu, main, others, len(sampler.seen))


def check_accounting(work: Path, burn: float = 0.3) -> str:
    """A process that starts a grandchild burning `burn` s of CPU and exits without waiting for it:
    the grandchild, orphaned, must still count in the run's CPU, as a helper left behind would."""
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        f"    end = time.process_time() + {burn!r}\n"
        "    while time.process_time() < end: pass\n"
        "    os._exit(0)\n"
    )
    run = measured([sys.executable, "-c", code], work / "accounting.log")
    if run.cpu < burn:
        raise SystemExit(
            f"CPU accounting misses an orphaned grandchild: {run.cpu:.2f} s counted of {burn} s burnt"
        )
    return f"accounting check: an orphaned grandchild's {burn:.2f} s of CPU counted ({run.cpu:.2f} s in all)"


def du_bytes(path: Path) -> int:
    """`du -sb`, as the state target is stated."""
    return int(
        subprocess.run(["du", "-sb", str(path)], check=True, capture_output=True, text=True).stdout.split()[0]
    )


# ---------------------------------------------------------------------------------------------
# verdicts
# ---------------------------------------------------------------------------------------------


def neardup_verdicts(path: Path) -> dict[str, str]:
    return {v["article_id"]: v["verdict"] for v in map(orjson.loads, path.read_bytes().splitlines())}


def peer_verdicts(path: Path) -> dict[str, str]:
    return {v["id"]: v["verdict"] for v in map(orjson.loads, path.read_bytes().splitlines())}


def agreement(ours: dict[str, str], theirs: dict[str, str]) -> str:
    """Articles both call a duplicate or both not (neardup's `partial` and `revised` are not
    duplicates), over the articles the peer decided."""
    shared = [article for article in theirs if article in ours]
    dup_ours = {a for a in shared if ours[a] == "duplicate"}
    dup_theirs = {a for a in shared if theirs[a] == "duplicate"}
    agree = sum((a in dup_ours) == (a in dup_theirs) for a in shared)
    return (
        f"{agree:,} of {len(shared):,} agree ({agree / max(1, len(shared)):.4f}); duplicates: "
        f"neardup {len(dup_ours):,}, peer {len(dup_theirs):,}, both {len(dup_ours & dup_theirs):,}"
    )


# ---------------------------------------------------------------------------------------------


@dataclass
class Engine:
    name: str
    argv: list[str]  # without the output path
    articles: int
    runs: list[Run] = field(default_factory=list)

    def median(self, attribute: str) -> float:
        return statistics.median(getattr(run, attribute) for run in self.runs)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()


def _mark(met: bool) -> str:
    return "met" if met else "MISSED"


def alternate(
    engines: list[Engine], repeats: int, work: Path, keep: bool
) -> tuple[dict[str, Path], list[int]]:
    """Each engine once a repeat, the order rotated each repeat; the verdict files of the last
    repeat, and neardup's state size (`du -sb` once it has closed) per repeat."""
    outputs: dict[str, Path] = {}
    state_bytes: list[int] = []
    total = engines[0].articles
    for repeat in range(repeats):
        shift = repeat % len(engines)
        for engine in engines[shift:] + engines[:shift]:
            out, state = work / f"{engine.name}-{repeat}.jsonl", work / f"state-{repeat}"
            command = [*engine.argv, "-o", str(out)]
            if engine.name == "neardup":
                command += ["--state", str(state)]
            run = measured(command, work / f"{engine.name}-{repeat}.log")
            engine.runs.append(run)
            outputs[engine.name] = out
            extra = ""
            if engine.name == "neardup":
                state_bytes.append(du_bytes(state))
                extra = f"; state {state_bytes[-1] / total:,.0f} B/article"
                if not keep:
                    shutil.rmtree(state)
            print(
                f"  run {repeat + 1} {engine.name:<10} {engine.articles:>6,} articles: "
                f"wall {run.wall:7.2f} s, CPU {run.cpu:7.2f} s ({run.processes} processes; /proc saw "
                f"{run.main_seen:.2f} s in the started one, {run.others_seen:.2f} s in its helpers){extra}",
                flush=True,
            )
            if run.cpu + 0.05 < run.main_seen + run.others_seen:
                print(f"  WARNING: CPU {run.cpu:.2f} s below what /proc saw: a helper's CPU is missing")
    return outputs, state_bytes


def report(engines: list[Engine], repeats: int, outputs: dict[str, Path], state_bytes: list[int]) -> None:
    """Medians, the targets beside them, and the verdicts' agreement."""
    total = engines[0].articles
    print(f"\nmedians of {repeats} alternated runs (a shared machine: compare within this run)")
    per: dict[str, tuple[float, float]] = {}
    for engine in engines:
        wall, cpu = engine.median("wall"), engine.median("cpu")
        per[engine.name] = (wall / engine.articles, cpu / engine.articles)
        note = "" if engine.articles == total else f" (the first {engine.articles:,} articles only)"
        print(
            f"  {engine.name:<10} wall {wall:7.2f} s, CPU {cpu:7.2f} s; per article "
            f"{per[engine.name][0] * 1e6:8,.0f} µs wall, {per[engine.name][1] * 1e6:8,.0f} µs CPU{note}"
        )
    cpu_ratio = per["neardup"][1] / per["rensa"][1]
    wall_ratio = per["neardup"][0] / per["rensa"][0]
    print("\ntargets (issue 41), ratios of the medians, neardup / peer")
    print(
        f"  CPU,  neardup/rensa      {cpu_ratio:6.3f}  target <= {CPU_TARGET}  "
        f"{_mark(cpu_ratio <= CPU_TARGET)}"
    )
    print(
        f"  wall, neardup/rensa      {wall_ratio:6.3f}  {1 / wall_ratio:.2f}x faster, target >= "
        f"{RENSA_SPEED_TARGET:.0f}x  {_mark(1 / wall_ratio >= RENSA_SPEED_TARGET)}"
    )
    if "datasketch" in per:
        ds_wall = per["neardup"][0] / per["datasketch"][0]
        ds_cpu = per["neardup"][1] / per["datasketch"][1]
        scope = " per article" if engines[2].articles != total else ""
        print(
            f"  wall, neardup/datasketch {ds_wall:6.3f}  {1 / ds_wall:.1f}x faster{scope}, target >= "
            f"{DATASKETCH_SPEED_TARGET:.0f}x  {_mark(1 / ds_wall >= DATASKETCH_SPEED_TARGET)}"
        )
        print(f"  CPU,  neardup/datasketch {ds_cpu:6.3f}{scope}")
    state = statistics.median(state_bytes) / total
    runs = ", ".join(f"{size / total:,.0f}" for size in state_bytes)
    print(
        f"  state, du -sb after close {state:,.0f} B/article, target <= {STATE_TARGET:,}  "
        f"{_mark(state <= STATE_TARGET)} (runs: {runs})"
    )
    ours = neardup_verdicts(outputs["neardup"])
    kinds: dict[str, int] = {}
    for verdict in ours.values():
        kinds[verdict] = kinds.get(verdict, 0) + 1
    print(f"\nverdicts of neardup: {dict(sorted(kinds.items()))}")
    for peer in (engine.name for engine in engines[1:]):
        print(f"  neardup against {peer}: {agreement(ours, peer_verdicts(outputs[peer]))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--input", type=Path, default=None, help="JSON lines {id, text} (default: the corpus)"
    )
    source.add_argument("--articles", type=int, default=None, help="N of bench_stream.py's generator instead")
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed, with --articles")
    parser.add_argument("--repeats", type=int, default=3)
    datasketch = parser.add_mutually_exclusive_group()
    datasketch.add_argument("--datasketch-articles", type=int, default=None, help="datasketch on a prefix")
    datasketch.add_argument("--no-datasketch", action="store_true")
    parser.add_argument("--neardup-flag", action="append", default=[], help="for `neardup dedup`, repeatable")
    parser.add_argument(
        "--commit", default=None, help="neardup as this commit holds it, in a venv of its own"
    )
    parser.add_argument("--venv", type=Path, default=None, help="the references' venv (default: built)")
    parser.add_argument("--keep", type=Path, default=None, help="leave inputs, verdicts, logs and state here")
    args = parser.parse_args(argv)

    peer_python = peer_venv(args.venv)
    neardup_bin = neardup_build(args.commit) if args.commit else Path(sys.executable).with_name("neardup")
    work = args.keep or Path(tempfile.mkdtemp(prefix="neardup-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if args.articles is not None:
            path = work / "articles.jsonl"
            write_input(path, args.articles, args.seed)
            described = f"bench_stream.py's generator (seed {args.seed}, 30% near-copies)"
        else:
            path = args.input or CORPUS
            if not path.exists():
                raise SystemExit(f"{path}: build it with tests/data/build_news_corpus.py")
            described = str(path)
        total = sum(1 for line in path.open("rb") if line.strip())
        script = [str(peer_python), str(PEERS / "minhash_dedup.py")]
        engines = [
            Engine("neardup", [str(neardup_bin), "dedup", str(path), "-q", *args.neardup_flag], total),
            Engine("rensa", [*script, "rensa", str(path)], total),
        ]
        if not args.no_datasketch:
            prefix = min(total, args.datasketch_articles or total)
            engines.append(
                Engine("datasketch", [*script, "datasketch", str(path), "--limit", str(prefix)], prefix)
            )
        if args.commit:
            build = f"neardup of {_git('rev-parse', '--short', args.commit)} as committed ({neardup_bin})"
        else:
            dirty = " with service/ modified" if _git("status", "--porcelain", "--", "service") else ""
            build = f"neardup of this checkout, {_git('rev-parse', '--short', 'HEAD')}{dirty}"
        print(f"{build}; {versions(peer_python)}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
        print(f"input: {described}, {total:,} articles; neardup flags: {args.neardup_flag or 'the defaults'}")
        become_subreaper()
        print(check_accounting(work), flush=True)
        outputs, state_bytes = alternate(engines, args.repeats, work, args.keep is not None)
        report(engines, args.repeats, outputs, state_bytes)
        print(f"load at the end {os.getloadavg()[0]:.2f}")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
