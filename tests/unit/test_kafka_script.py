"""deploy/kafka/kafka.sh stop: a port held a moment longer by a process on its way out is waited for,
not blamed on another process. A SIGKILLed JVM's main thread shows as a zombie (what `alive` takes
for gone) while its other threads still close its sockets; the check that no other process holds
the brokers' ports must not fail a clean stop for that."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Listens on a port, lets its main thread exit (the process reads as a zombie in /proc), and closes
# the socket from another thread `linger` seconds later.
LINGERING = """
import ctypes, os, socket, sys, threading, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen()
def close_later():
    time.sleep(float(sys.argv[2]))
    server.close()
    os._exit(0)
threading.Thread(target=close_later).start()
print("listening", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_stop_waits_for_a_port_a_dying_process_still_holds(tmp_path: Path) -> None:
    port = free_port()
    holder = subprocess.Popen([sys.executable, "-c", LINGERING, str(port), "1.5"], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"listening\n"
        stop = [str(REPO / "deploy/kafka/kafka.sh"), "stop", "--port", str(port), "--dir", str(tmp_path)]
        stopped = subprocess.run(stop, capture_output=True, text=True, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        assert holder.wait(timeout=10) == 0, "the port was given up by its holder, not taken from it"
    finally:
        holder.kill()
        holder.wait()
