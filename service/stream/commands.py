"""Stream commands: `neardup worker`, `neardup produce FILE.jsonl`, `neardup tail`, and the
changelog side of `neardup stats`. Every command's parser imports this module: what only running a
stream command needs (asyncio, Faust, aiokafka) is imported when one runs."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import orjson

from ..config import ConfigError, FlagSet, Mode, Settings
from ..messages import id_key, verdict_line, verdicts_summary
from ..state.port import IndexStats

# The settings the stream commands take as flags (service/config.py's table), over NEARDUP_*.
WORKER_FLAGS = FlagSet.of(Mode.WORKER)
TOOL_FLAGS = FlagSet.named("broker", "input_topic", "verdicts_topic")
T = TypeVar("T")


def _settings(args: argparse.Namespace, flags: FlagSet | None, **more: Any) -> Settings:
    try:
        return Settings.from_env(**(flags.given(args) if flags else {}), **more)
    except ConfigError as exc:
        raise SystemExit(f"configuration error: {exc}") from exc


def _tool_settings(args: argparse.Namespace, flags: FlagSet | None, **more: Any) -> Settings:
    """A client command's settings, with what they expose said on stderr."""
    settings = _settings(args, flags, **more)
    for warning in settings.security_warnings():
        print(f"warning: {warning}", file=sys.stderr)
    return settings


def _run_client(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run for a client command: a broker it cannot connect to ends it with the message
    that says where, how and why (connect.py), and a non-zero exit, not a traceback."""
    import asyncio

    from .connect import BrokerUnreachable

    try:
        return asyncio.run(main)
    except BrokerUnreachable as exc:
        raise SystemExit(f"error: {exc}") from None


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "worker",
        help="run the Faust worker (extra arguments go to Faust's worker command)",
        description="Run the stream worker. Unknown arguments (e.g. --loglevel debug) pass to Faust.",
    )
    WORKER_FLAGS.add_to(p)
    p.set_defaults(func=cmd_worker, passthrough=True)

    p = sub.add_parser("produce", help="send a JSON-lines file of articles to the input topic")
    TOOL_FLAGS.add_to(p)
    p.add_argument("file")
    p.add_argument("--rate", type=float, default=0.0, help="articles per second (0 = as fast as possible)")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("tail", help="follow the verdict topic")
    TOOL_FLAGS.add_to(p)
    p.add_argument("--json", action="store_true", help="JSON lines instead of a readable summary")
    p.add_argument("--from-beginning", action="store_true")
    p.add_argument("--max", type=int, default=0, help="stop after N verdicts")
    p.add_argument("--idle-timeout", type=float, default=0.0, help="stop after S seconds with no verdict")
    p.add_argument("--summary", action="store_true", help="at the end, print counts by kind and the clusters")
    p.set_defaults(func=cmd_tail)


_FAUST_LEVELS = {"warning": "warn", "critical": "crit"}


def worker_settings(args: argparse.Namespace) -> Settings:
    """The worker's settings: NEARDUP_* variables, then its flags."""
    return _settings(args, WORKER_FLAGS)


def cmd_worker(args: argparse.Namespace) -> int:
    import asyncio

    from ..testhooks import load_test_hooks
    from .app import create_app, exit_after
    from .connect import BrokerUnreachable
    from .metrics import Metrics, serve
    from .topics import TopicMismatch, ensure_topics

    settings = worker_settings(args)
    load_test_hooks("worker")
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"
    )
    log = logging.getLogger("neardup.worker")
    for warning in settings.security_warnings():
        log.warning("insecure_connection detail=%r", warning)
    try:
        asyncio.run(asyncio.wait_for(ensure_topics(settings), timeout=60))
    except TopicMismatch as exc:
        log.error("topic_mismatch detail=%r", str(exc))
        return 2
    except BrokerUnreachable as exc:
        log.error("broker_unavailable %s", exc)
        return 2
    except Exception as exc:  # broker unreachable etc.
        log.error("broker_unavailable broker=%s error=%r", settings.bootstrap_servers, str(exc))
        return 2
    asyncio.set_event_loop(asyncio.new_event_loop())
    (settings.state_path / "faust").mkdir(parents=True, exist_ok=True)
    metrics = Metrics(settings.stall_timeout)
    metrics.watch_gc()
    server = serve(metrics, settings.metrics_host, settings.metrics_port)
    log.info(
        "starting app_id=%s broker=%s input=%s state_dir=%s instance_id=%s metrics=%s:%d",
        settings.app_id,
        settings.bootstrap_servers,
        settings.input_topic,
        settings.state_dir,
        settings.group_instance_id(),
        settings.metrics_host,
        settings.metrics_port,
    )
    app, runtime = create_app(settings, metrics, exit_later=exit_after)
    faust_level = _FAUST_LEVELS.get(settings.log_level.lower(), settings.log_level.lower())
    # Faust's CLI would turn its web server (which can show tables) back on, bound to 0.0.0.0;
    # --without-web keeps it off, our own server serves /metrics and /health on loopback.
    web = ["--without-web", "--web-bind", settings.web_host]
    sys.argv = ["neardup", "worker", *web, "--loglevel", faust_level, *getattr(args, "extra", [])]
    try:
        app.main()
    except SystemExit:
        if not runtime.failure.failed:
            raise
        # Faust exits 0 after the stop the worker asked for itself (pipeline/health.py: Failure), which
        # whatever supervises the worker must see as a failure
    finally:
        runtime.sign.signer.close()
        runtime.index.decider.kill()  # closed cleanly on shutdown already (index_agent.py: IndexAgent.close)
        server.shutdown()
    return 1 if runtime.failure.failed else 0


def cmd_produce(args: argparse.Namespace) -> int:
    settings = _tool_settings(args, TOOL_FLAGS)
    sent = _run_client(produce_file(settings, Path(args.file), args.rate))
    print(f"sent {sent} messages to {settings.input_topic}")
    return 0


async def produce_file(settings: Settings, path: Path, rate: float = 0.0) -> int:
    """Send each non-empty line as one message, keyed by its id when it has one."""
    import asyncio

    from aiokafka import AIOKafkaProducer

    from .connect import start_client

    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        linger_ms=5,
        acks="all",
        enable_idempotence=True,  # keeps file order within a partition across retries
        **settings.client_security(),
    )
    await start_client(settings, producer)
    sent = 0
    started = time.perf_counter()
    try:
        with path.open("rb") as lines:
            for line in lines:
                body = line.rstrip(b"\r\n")
                if not body.strip():
                    continue
                await producer.send(settings.input_topic, body, key=id_key(body))
                sent += 1
                if rate > 0:  # a sleep until a time past returns at once
                    await asyncio.sleep(started + sent / rate - time.perf_counter())
        await producer.flush()
    finally:
        await producer.stop()
    return sent


def cmd_tail(args: argparse.Namespace) -> int:
    settings = _tool_settings(args, TOOL_FLAGS)
    seen: list[dict[str, Any]] = []
    with contextlib.suppress(KeyboardInterrupt):
        _run_client(tail(settings, args, seen))
    if args.summary:
        print(verdicts_summary(seen))
    return 0


async def tail(settings: Settings, args: argparse.Namespace, seen: list[dict[str, Any]]) -> None:
    """Print the verdicts as they come (as JSON lines with --json), each appended to `seen` (what
    --summary counts), until --max of them (0: no limit) or --idle-timeout seconds with none (0: no
    timeout)."""
    from aiokafka import AIOKafkaConsumer

    from .connect import start_client

    consumer = AIOKafkaConsumer(
        settings.verdicts_topic,
        bootstrap_servers=settings.bootstrap_servers,
        auto_offset_reset="earliest" if args.from_beginning else "latest",
        enable_auto_commit=False,
        group_id=None,
        **settings.client_security(),
    )
    await start_client(settings, consumer)
    last_seen = time.monotonic()
    try:
        while not args.max or len(seen) < args.max:
            batch = await consumer.getmany(timeout_ms=500)
            if not batch and args.idle_timeout and time.monotonic() - last_seen > args.idle_timeout:
                break
            for records in batch.values():
                for record in records:
                    last_seen = time.monotonic()
                    verdict = orjson.loads(record.value)
                    seen.append(verdict)
                    line = record.value.decode() if args.json else verdict_line(verdict)
                    sys.stdout.write(line + "\n")
            sys.stdout.flush()
    finally:
        await consumer.stop()


def changelog_stats(args: argparse.Namespace) -> IndexStats:
    """`neardup stats --broker`: the worker's records as its changelog holds them, rebuilt into a
    scratch index by the decider's own rebuild, with the removals the worker counted; bytes are
    those of the live records in the log."""
    import tempfile

    from ..pipeline.stats import rebuilt_stats
    from .topics import ChangelogReader

    given = {"broker": args.broker, "app_id": args.app_id}
    settings = _tool_settings(args, None, **{k: v for k, v in given.items() if v is not None})
    with tempfile.TemporaryDirectory(prefix="neardup-stats-") as scratch:
        stats = rebuilt_stats(settings.params(), ChangelogReader(settings), Path(scratch) / "index")
        return _run_client(stats)
