"""neardup.stream.metrics: the Prometheus registry and the /metrics + /health HTTP server."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator

import orjson
import pytest

from neardup.messages import DEAD_LETTER_REASONS
from neardup.stream.metrics import Metrics, serve


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.port = free_port()
        self.httpd = serve(metrics, "127.0.0.1", self.port)

    def get(self, path: str) -> tuple[int, str, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.getheader("Content-Type") or "", response.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """One server for the module: each shutdown waits for the serving loop's 0.5 s poll."""
    running = Server(Metrics())
    yield running
    running.httpd.shutdown()
    running.httpd.server_close()


def test_metrics_endpoint(server: Server) -> None:
    server.metrics.articles_in.inc(3)
    server.metrics.verdicts.labels("duplicate").inc()
    server.metrics.dead_letters.labels("invalid_json").inc(2)
    server.metrics.latency.observe(0.004)
    status, ctype, body = server.get("/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    text = body.decode()
    assert "neardup_articles_in_total 3.0" in text
    assert 'neardup_verdicts_total{kind="duplicate"} 1.0' in text  # only this test counts
    assert 'neardup_verdicts_total{kind="unique"} 0.0' in text
    assert 'neardup_dead_letters_total{reason="invalid_json"} 2.0' in text
    for reason in DEAD_LETTER_REASONS:  # every reason is exported from the start, at zero if unused
        assert f'neardup_dead_letters_total{{reason="{reason}"}}' in text
    assert 'neardup_latency_seconds_bucket{le="0.005"} 1.0' in text
    assert "neardup_indexed_articles" in text and "neardup_index_replays" in text


def test_health_follows_readiness(server: Server) -> None:
    server.metrics.ready.clear()
    status, ctype, body = server.get("/health")
    assert (status, ctype) == (503, "application/json")
    assert orjson.loads(body)["status"] == "starting"
    server.metrics.ready.set()
    status, _, body = server.get("/health")
    health = orjson.loads(body)
    assert status == 200 and health["status"] == "ok" and health["uptime_s"] >= 0


@pytest.mark.parametrize(
    "path", ["/", "/table", "/table/records", "/tables", "/records", "/router", "/../etc"]
)
def test_everything_else_is_not_found(server: Server, path: str) -> None:
    server.metrics.ready.set()
    status, _, body = server.get(path)
    assert status == 404
    assert b"neardup_" not in body


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.articles_in.inc()
    assert a.registry.get_sample_value("neardup_articles_in_total") == 1.0
    assert b.registry.get_sample_value("neardup_articles_in_total") == 0.0


def test_shutdown_frees_the_port() -> None:
    running = Server(Metrics())
    assert running.get("/metrics")[0] == 200
    running.httpd.shutdown()
    running.httpd.server_close()
    with pytest.raises(OSError):
        running.get("/metrics")


def test_gc_pauses_are_timed() -> None:
    import gc

    metrics = Metrics()
    callback = metrics.watch_gc()
    try:
        gc.collect()
        gc.collect()
    finally:
        gc.callbacks.remove(callback)
    registry = metrics.registry
    assert registry.get_sample_value("neardup_gc_pause_seconds_count", {"generation": "2"}) == 2.0
    assert registry.get_sample_value("neardup_gc_pause_seconds_sum", {"generation": "2"}) > 0.0
