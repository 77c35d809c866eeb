"""The `neardup` command: worker, produce, tail (stream); dedup, compare, tune, evaluate (embedded)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import orjson

from .config import ConfigError, FlagSet, Mode, engine_params, retention_window
from .core.lsh import candidate_probability, error_areas
from .core.minhash import estimate_jaccard
from .core.normalize import decode_bytes, normalize
from .core.params import IncompatibleState
from .core.shingle import shingle_hashes, shingle_set, shingle_strings
from .core.similarity import block_similarity, exact_containment, exact_jaccard
from .state.port import IndexStats

# The settings each command takes as flags (service/config.py's table): the commands that decide
# read NEARDUP_* variables under their flags, as the worker does; tune and compare, calculators, do not.
DEDUP_FLAGS = FlagSet.of(Mode.DEDUP)
EVALUATE_FLAGS = FlagSet.of(Mode.EVALUATE)
TUNE_FLAGS = FlagSet.named("threshold", "num_perm", "fn_weight", "bands", "rows", env=False)
COMPARE_FLAGS = FlagSet.named("shingle_size", "num_perm", "seed", env=False)


def _error(message: object, status: int = 2) -> int:
    """What a command refuses or failed at, said in one line; its exit status."""
    print(f"error: {message}", file=sys.stderr)
    return status


def _refusing(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """`command(args)`, with a setting, a state or a path it refuses said in one line and exit
    status 2, not a traceback."""
    try:
        return command(args)
    except (ConfigError, IncompatibleState) as exc:
        return _error(exc)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        return _error(f"{exc.filename}: {exc.strerror}")


def _read_text(path: str) -> str:
    decoded = decode_bytes(Path(path).read_bytes())
    if decoded.guessed:
        print(f"note: {path} is not UTF-8; decoded as {decoded.encoding}", file=sys.stderr)
    return decoded.text


def cmd_compare(args: argparse.Namespace) -> int:
    raw_a, raw_b = _read_text(args.a), _read_text(args.b)
    if args.local:
        from .local_similarity.report import render_compare_local

        print(render_compare_local(raw_a, raw_b, color=sys.stdout.isatty()))
        return 0
    params = engine_params(COMPARE_FLAGS.resolve(args))
    options, k = params.shingle, params.shingle.k
    raw_set_a, raw_set_b = shingle_strings(raw_a, k), shingle_strings(raw_b, k)
    raw_j = len(raw_set_a & raw_set_b) / len(raw_set_a | raw_set_b) if raw_set_a or raw_set_b else 1.0
    canon_a, canon_b = normalize(raw_a), normalize(raw_b)
    set_a, set_b = shingle_set(canon_a, options), shingle_set(canon_b, options)
    sig_a, _ = params.hasher.signature(shingle_hashes(canon_a, options))
    sig_b, _ = params.hasher.signature(shingle_hashes(canon_b, options))
    rows = [
        (f"jaccard, raw {k}-shingles", raw_j),
        (f"jaccard, normalized {k}-shingles", exact_jaccard(set_a, set_b)),
        (f"minhash estimate ({params.num_perm} slots)", estimate_jaccard(sig_a, sig_b)),
        ("containment of A in B", exact_containment(set_a, set_b)),
        ("containment of B in A", exact_containment(set_b, set_a)),
        ("4-character block similarity", block_similarity(raw_a, raw_b)),
    ]
    print(f"A={args.a} ({len(set_a)} shingles)  B={args.b} ({len(set_b)} shingles)")
    for label, value in rows:
        print(f"{label:<40} {value:.6f}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    values = TUNE_FLAGS.resolve(args)
    if values["threshold"] >= 1.0:  # the LSH threshold it tunes for must leave room above it
        raise ConfigError(f"--threshold must be below 1 to tune for, got {values['threshold']}")
    params = engine_params({**values, "containment_threshold": None, "lsh_threshold": values["threshold"]})
    lsh = params.lsh
    print(
        f"threshold={params.threshold} num_perm={params.num_perm} fn_weight={params.fn_weight} -> "
        f"bands={lsh.bands} rows={lsh.rows} (uses {lsh.used_slots} slots)"
    )
    print(
        f"false-positive area={lsh.false_positive_area:.5f} false-negative area={lsh.false_negative_area:.5f}"
    )
    print("similarity  P(candidate)")
    for s in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0):
        print(f"{s:>10.2f}  {float(candidate_probability(s, lsh.bands, lsh.rows)):.6f}")
    if args.plot:
        _plot_s_curve(Path(args.plot), params.threshold, lsh.bands, lsh.rows)
        print(f"S-curve written to {args.plot}")
    return 0


def _plot_s_curve(path: Path, threshold: float, bands: int, rows: int) -> None:
    try:
        from matplotlib.figure import Figure  # not pyplot: no display backend to choose or figure to close
    except ImportError as exc:
        raise SystemExit("--plot needs matplotlib: pip install 'neardup[dev]'") from exc
    s = np.linspace(0, 1, 501)
    p = candidate_probability(s, bands, rows)
    fp, fn = error_areas(threshold, bands, rows)
    fig = Figure(figsize=(6, 4), dpi=120)
    ax = fig.subplots()
    ax.plot(s, p, color="black", label=f"1-(1-s^{rows})^{bands}")
    shade = functools.partial(ax.fill_between, s, alpha=0.3)
    shade(0, p, where=s <= threshold, color="tab:red", label=f"false positives {fp:.4f}")
    shade(p, 1, where=s >= threshold, color="tab:blue", label=f"false negatives {fn:.4f}")
    ax.axvline(threshold, linestyle="--", color="grey")
    ax.set_xlabel("Jaccard similarity s")
    ax.set_ylabel("P(candidate)")
    ax.set_title(f"LSH S-curve: b={bands}, r={rows}, threshold={threshold}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)


def cmd_dedup(args: argparse.Namespace) -> int:
    from .api import open_state
    from .embedded import ResumeMismatch, SigningFailed, run_file
    from .messages import parse_verdict_filter
    from .state.rocks import StateError

    values = DEDUP_FLAGS.resolve(args)
    params = engine_params(values)
    if hasattr(args, "unique_filter") and args.unique_out is None:
        # a filter with nothing to filter into is a forgotten --unique-out, not a no-op to allow
        raise ConfigError("--unique-filter needs --unique-out FILE")
    if (args.sign_processes or 0) < 0:
        raise ConfigError("--sign-processes must be 0 or more")
    try:
        # a run resumes from the checkpoint it stores with its writes: they skip the write-ahead log
        state = open_state(args.state or None, values["bucket_cap"], checkpointed=True)
        with contextlib.closing(state):
            summary = run_file(
                Path(args.input),
                Path(args.output),
                state,
                params,
                dead_letter_path=Path(args.dead_letters) if args.dead_letters else None,
                max_text_bytes=values["max_text_bytes"],
                progress=sys.stderr.isatty() and not args.quiet,
                retention=retention_window(values),
                feed_path=Path(args.unique_out) if args.unique_out else None,
                feed_verdicts=parse_verdict_filter(values["unique_filter"]),
                sign_processes=args.sign_processes,
            )
    except (StateError, ResumeMismatch) as exc:  # StateError: the state could not be opened
        return _error(exc)
    except SigningFailed as exc:
        where = "" if args.state else " (without --state a rerun starts over)"
        return _error(f"{exc}{where}", 1)
    print(summary.render())
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """What a state holds: from a state directory (embedded mode's, or a worker's, read beside it),
    or from a worker's changelog on the broker."""
    if args.state:
        from .state.rocks import RocksState, StateError

        path = Path(args.state)
        if (path / "index" / "CURRENT").exists():  # a worker's state directory
            path = path / "index"
        if not (path / "CURRENT").exists():
            return _error(f"no state at {args.state}")
        try:
            with contextlib.closing(RocksState(path, read_only=True)) as state:
                stats = state.stats()
        except StateError as exc:  # the state could not be opened
            return _error(exc)
    else:
        from .stream.commands import changelog_stats

        stats = changelog_stats(args)
    print(orjson.dumps(stats.as_dict()).decode() if args.json else render_stats(stats))
    return 0


def render_stats(stats: IndexStats) -> str:
    def when(ms: int | None) -> str:
        return "-" if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")

    lines = [
        f"articles indexed   {stats.articles:,}",
        f"clusters           {stats.clusters:,}",
        f"oldest article     {when(stats.oldest_ms)}",
        f"newest article     {when(stats.newest_ms)}",
        f"buckets            {stats.buckets:,} "
        f"(largest {stats.largest_bucket:,} members, capped at {stats.bucket_cap})",
        f"anchor postings    {stats.anchor_postings:,} "
        f"({stats.boilerplate_anchors:,} boilerplate: full at {stats.anchor_cap})",
        f"bytes on disk      {stats.bytes_on_disk:,}",
        f"expired            {stats.expired:,}",
        f"deleted            {stats.deleted:,}",
    ]
    return "\n".join(lines)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .evaluation import evaluate, render
    from .messages import Article, InvalidMessage, decode_article

    values = EVALUATE_FLAGS.resolve(args)
    params = engine_params(values)
    articles = []
    for line in Path(args.input).read_bytes().splitlines():
        with contextlib.suppress(InvalidMessage):  # what the worker would dead-letter, blank lines too
            article = decode_article(line, values["max_text_bytes"])
            if isinstance(article, Article):
                articles.append(article)
    articles = articles[: args.limit or None]  # --limit 0: every article
    result = evaluate(
        articles, params, margin=args.margin, sample_size=args.samples, bucket_cap=values["bucket_cap"]
    )
    print(render(result, params, args.margin))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neardup", description="Near-duplicate detection for news text.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compare", help="similarity measures of two text files")
    p.add_argument("a")
    p.add_argument("b")
    COMPARE_FLAGS.add_to(p)
    p.add_argument(
        "--local",
        action="store_true",
        help="passage-level analysis: chunk and fuzzy fingerprints, cosine, shared passages",
    )
    p.set_defaults(func=functools.partial(_refusing, cmd_compare))

    p = sub.add_parser("tune", help="choose LSH bands/rows for a threshold; draw the S-curve")
    TUNE_FLAGS.add_to(p)
    p.add_argument("--plot", metavar="FILE.png")
    p.set_defaults(func=functools.partial(_refusing, cmd_tune))

    p = sub.add_parser("dedup", help="embedded mode: a JSON-lines file of articles, no broker")
    p.add_argument("input", help="articles, one JSON object per line ({'id','text',...})")
    p.add_argument("-o", "--output", required=True, help="verdicts, JSON lines, in input order")
    p.add_argument("--state", help="RocksDB state directory (resumable); memory if unset")
    p.add_argument("--dead-letters", help="default: OUTPUT.dead.jsonl")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--sign-processes",
        metavar="N",
        type=int,
        help="helper processes that sign while this one decides (0: sign in this process, less CPU "
        "in all; default: 0 for an input under 16 MiB, else CPUs - 1, at least 1)",
    )
    p.add_argument(
        "--unique-out",
        metavar="FILE",
        help="also copy the input lines whose verdict passes --unique-filter here, unchanged, in order",
    )
    DEDUP_FLAGS.add_to(p)
    p.set_defaults(func=functools.partial(_refusing, cmd_dedup))

    p = sub.add_parser("stats", help="what a state holds: articles, clusters, times, buckets, bytes")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--state", help="a state directory (embedded --state, or a worker's NEARDUP_STATE_DIR)"
    )
    where.add_argument("--broker", help="a broker: the worker's changelog (see NEARDUP_APP_ID)")
    p.add_argument("--app-id", help="with --broker: the worker's NEARDUP_APP_ID")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("evaluate", help="LSH verdicts against brute-force exact Jaccard")
    p.add_argument("input")
    p.add_argument("--margin", type=float, default=0.05)
    p.add_argument("--samples", type=int, default=5, help="articles to show top-3 matches for")
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N articles")
    EVALUATE_FLAGS.add_to(p)
    p.set_defaults(func=functools.partial(_refusing, cmd_evaluate))

    with contextlib.suppress(ImportError):  # without the stream commands, the embedded ones still work
        from .stream import commands

        commands.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
