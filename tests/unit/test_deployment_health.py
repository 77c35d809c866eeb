"""The integration tests' reading of a worker's /health (tests/support/deployment.py): a worker that
exits while it answers cuts its answer short, which counts as no answer, not as the test's failure."""

from __future__ import annotations

import socket
import threading

from tests.support.deployment import health


def serve_once(reply: bytes) -> str:
    """A URL whose server answers one request with `reply` and closes the connection."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        with server, server.accept()[0] as connection:
            connection.recv(4096)
            connection.sendall(reply)

    threading.Thread(target=answer, daemon=True).start()
    return f"http://127.0.0.1:{server.getsockname()[1]}/health"


def test_an_answer_cut_short_is_no_answer() -> None:
    head = (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 154\r\n\r\n"
    )
    assert health(serve_once(head)) is None
    assert health(serve_once(head.replace(b"154", b"17") + b'{"status": "bad"}')) == (503, {"status": "bad"})
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n"
    assert health(serve_once(ok + b'{"status": "ok"}')) == (200, {"status": "ok"})
    assert health(serve_once(ok)) is None
