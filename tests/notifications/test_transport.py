"""The HTTP transport: one POST with a whole-request deadline and no proxy from the environment.

Where it may connect (the address guard, pinning, HTTPS names) is in test_targets.py.
"""

from __future__ import annotations

import socket
import threading
import time

from notifications import transport


def test_a_receiver_that_trickles_its_headers_is_cut_at_the_deadline(monkeypatch):
    """Socket timeouts bound each read only: the whole request has its own deadline."""
    monkeypatch.setattr(transport, "TIMEOUT_SECONDS", 1.0)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def trickle():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            for n in range(12):  # one header line every 0.4 s: 4.8 s in all
                time.sleep(0.4)
                try:
                    conn.sendall(f"X-Slow-{n}: 1\r\n".encode())
                except OSError:
                    return

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    started = time.monotonic()

    outcome = transport.post(f"http://127.0.0.1:{port}/hook", b"{}", {})

    elapsed = time.monotonic() - started
    thread.join(10)
    listener.close()
    assert (outcome.ok, outcome.status_code, outcome.error) == (False, None, "timed out after 1 s")
    assert elapsed < 2.5


def test_post_ignores_proxies_from_the_environment(receiver, monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)

    outcome = transport.post(receiver.url, b"{}", {})

    assert (outcome.ok, outcome.status_code) == (False, 401)  # the receiver itself answered
    assert len(receiver.received) == 1
