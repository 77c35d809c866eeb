"""Prometheus metrics and the probes on a small HTTP server bound to loopback by default.

/health is liveness (a wedged process: a supervisor restarts it), /ready is readiness (delivery:
a broker outage makes the worker not ready, and restarting it would not bring the broker back).
Nothing here serves table contents (Faust's own web server, which can show tables, is disabled by
the worker).
"""

from __future__ import annotations

import functools
import gc
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..messages import DEAD_LETTER_REASONS, VERDICT_KINDS


class Metrics:
    """The service's metrics, in their own registry so tests can create several."""

    def __init__(self, stall_timeout: float = 60.0) -> None:
        self.registry = CollectorRegistry()
        counter = functools.partial(Counter, registry=self.registry)
        gauge = functools.partial(Gauge, registry=self.registry)
        histogram = functools.partial(Histogram, registry=self.registry)
        # articles in, verdicts and dead letters out, how long it took, and what the index holds
        self.articles_in = counter("neardup_articles_in", "Articles consumed by the sign stage")
        self.verdicts = counter("neardup_verdicts", "Verdicts published", ["kind"])
        self.dead_letters = counter("neardup_dead_letters", "Messages dead-lettered", ["reason"])
        self.replays = counter("neardup_index_replays", "Re-delivered signatures by outcome", ["status"])
        self.latency = histogram(
            "neardup_latency_seconds",
            "Produce-to-verdict latency",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        # what the index holds, and what left it
        self.indexed = gauge("neardup_indexed_articles", "Articles in the index")
        self.clusters = gauge("neardup_index_clusters", "Clusters of articles in the index")
        self.buckets = gauge("neardup_index_buckets", "LSH band buckets in the index")
        self.largest_bucket = gauge(
            "neardup_index_largest_bucket", "Members of the largest LSH bucket (at most the cap)"
        )
        self.anchor_postings = gauge(
            "neardup_index_anchor_postings", "Anchor posting lists in the index (containment)"
        )
        self.boilerplate_anchors = gauge(
            "neardup_index_boilerplate_anchors",
            "Anchor posting lists at their cap: phrases of many articles, proposing no candidate",
        )
        self.index_bytes = gauge("neardup_index_bytes", "Bytes of the index on disk (measured every 10 s)")
        self.oldest = gauge(
            "neardup_index_oldest_seconds", "Event time of the oldest article held (Unix seconds)"
        )
        self.newest = gauge(
            "neardup_index_newest_seconds", "Newest event time seen (Unix seconds): retention counts from it"
        )
        self.expired = counter("neardup_expired", "Articles removed by the retention window")
        self.transactions = counter(
            "neardup_index_transactions",
            "The index stage's transactions (exactly_once) by outcome: committed, aborted",
            ["outcome"],
        )
        self.deletes = counter(
            "neardup_deletes", "Deletions (input tombstones) by outcome: deleted, or unknown id", ["status"]
        )
        self._declare_worker(self.registry)
        # each labelled series is exported from the start, at zero until its first event
        for family, values in (
            (self.dead_letters, DEAD_LETTER_REASONS),
            (self.verdicts, VERDICT_KINDS),
            (self.deletes, ("deleted", "unknown_delete")),
            (self.index_opens, ("restored", "rebuilt")),
            (self.transactions, ("committed", "aborted")),
        ):
            for value in values:
                family.labels(value)
        self.started = time.time()
        self.ready = threading.Event()
        # Written by the event loop, read by the HTTP thread (single attribute stores)
        self.failure: str | None = None  # the failure the worker stops for
        self.stalled: str | None = None  # what the last watch found stuck
        self.unready: str | None = None  # why the last watch found the worker not ready
        self.loop_beat: float | None = None  # monotonic time of the event loop's last watch
        self.broker_seen = time.monotonic()  # when a broker last answered the worker's check
        self.stall_timeout = stall_timeout  # the worker's NEARDUP_STALL_TIMEOUT, for /health

    def _declare_worker(self, r: CollectorRegistry) -> None:
        """How the worker reads its input and keeps up: refused times, offset gaps, hand-offs,
        index openings, the filtered feed, consumer lag and the garbage collector's pauses."""
        counter = functools.partial(Counter, registry=r)
        gauge = functools.partial(Gauge, registry=r)
        histogram = functools.partial(Histogram, registry=r)
        self.refused_times = counter(
            "neardup_refused_times",
            "Articles whose published_at or record timestamp was not used (unparseable, or ahead)",
        )
        self.offset_gaps = counter(
            "neardup_offset_gaps",
            "Gaps in the offsets delivered: a message came after a gap in its partition",
            ["topic"],
        )
        self.offset_gap_messages = counter(
            "neardup_offset_gap_messages",
            "Messages found in the gaps (read back and handled in their place): the consumer skipped them",
            ["topic"],
        )
        self.handed_off = counter(
            "neardup_index_handed_off",
            "Signatures messages decided as soon as their send was acknowledged, not after a fetch",
        )
        self.index_opens = counter(
            "neardup_index_opens",
            "Index openings at the shard's assignment (or a decider's replacement): restored from "
            "its committed changelog offset, or rebuilt from the whole changelog",
            ["how"],
        )
        self.index_replayed = counter(
            "neardup_index_replayed_records",
            "Changelog records applied to the index by restores (those after its committed offset)",
        )
        self.standby = gauge(
            "neardup_index_standby",
            "1 while this worker keeps a warm standby copy of the index (NEARDUP_STANDBY_REPLICAS) "
            "and does not own the shard, else 0",
        )
        self.standby_lag = gauge(
            "neardup_index_standby_lag_records",
            "Changelog offsets the standby copy was behind at its last catch-up (changelog end - "
            "its stored position): about what a takeover would replay",
        )
        self.standby_applied = counter(
            "neardup_index_standby_applied_records",
            "Changelog records the standby copy applied as it caught up from its stored position "
            "(its first build, from the whole changelog, is not counted)",
        )
        self.fed = counter(
            "neardup_feed_messages",
            "Input messages forwarded to the filtered feed (NEARDUP_UNIQUE_TOPIC) and acknowledged",
        )
        self.signatures_purged = gauge(
            "neardup_signatures_log_start",
            "Log start offset of the signatures topic after the last purge (messages below it were decided)",
        )
        self.lag = gauge(
            "neardup_consumer_lag", "Messages behind the high-water mark", ["topic", "partition"]
        )
        self.gc_pauses = histogram(
            "neardup_gc_pause_seconds",
            "Python garbage-collector pauses, which stop every stage of the worker",
            ["generation"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
        )

    def watch_gc(self) -> Callable[[str, dict[str, Any]], None]:
        """Time every collection: a full (generation 2) pass over a large decoded-record cache stops
        every stage of the worker, so the pauses explain the latency tail when it grows."""
        started: list[float] = []

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started[:] = [time.perf_counter()]
            elif started:
                self.gc_pauses.labels(str(info["generation"])).observe(time.perf_counter() - started[0])

        gc.callbacks.append(on_gc)
        return on_gc  # for gc.callbacks.remove

    def health(self) -> dict[str, Any]:
        """Liveness: "ok" unless the worker is wedged or done. "failed" once it stops for a failure,
        "stalled" when an agent or the event loop itself is stuck (a liveness probe restarts it),
        "starting" until the helpers are warm. A broker outage is none of these (`readiness`)."""
        beat, stalled = self.loop_beat, self.stalled  # each read once: the event loop writes them
        if self.failure is not None:
            return self._answer("failed", self.failure)
        if not self.ready.is_set():
            return self._answer("starting", None)
        if beat is not None and time.monotonic() - beat > self.stall_timeout:
            return self._answer("stalled", f"event loop unresponsive for {time.monotonic() - beat:.0f} s")
        return self._answer("ok" if stalled is None else "stalled", stalled)

    def readiness(self) -> dict[str, Any]:
        """Readiness: "ok" while the worker delivers; "not_ready" while its sends wait for the
        broker's acknowledgement, no broker answers, or the index opens; whatever liveness says
        when that is not ok."""
        live = self.health()
        if live["status"] == "ok" and self.unready is not None:
            return self._answer("not_ready", self.unready)
        return live

    def _answer(self, status: str, reason: str | None) -> dict[str, Any]:
        answer: dict[str, Any] = {"status": status, "uptime_s": round(time.time() - self.started, 1)}
        if reason is not None:
            answer["reason"] = reason
        return answer


def serve(metrics: Metrics, host: str, port: int) -> ThreadingHTTPServer:
    """Start the HTTP server in a daemon thread and return it (call .shutdown() to stop)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                body, ctype, code = generate_latest(metrics.registry), CONTENT_TYPE_LATEST, 200
            elif self.path.startswith(("/health", "/ready")):
                probe = metrics.health() if self.path.startswith("/health") else metrics.readiness()
                body, ctype = orjson.dumps(probe), "application/json"
                code = 200 if probe["status"] == "ok" else 503
            else:
                body, ctype, code = b"not found\n", "text/plain", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: scrapes are not events
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="neardup-metrics", daemon=True).start()
    return server
