"""The HTTP transport of webhooks: one POST to a checked address, with a whole-request deadline.

post() resolves the URL's host once, asks the address guard (targets) about every address,
then connects only to a checked one (pinned, so a name re-pointed after the check cannot
redirect it), follows no redirect, uses no proxy from the environment, and gives up after
TIMEOUT_SECONDS from connect to status. It signs nothing and records nothing: it answers an
Outcome, which deliveries records.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from notifications.attempts import short_error
from notifications.targets import (
    IPAddress,
    Unresolvable,
    WebhookURLError,
    addresses_of,
    refusal_for,
    target,
)

TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status_code: int | None
    error: str
    duration_ms: int


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # the 3xx response reaches the caller as an HTTPError


# A name may resolve to many addresses; each gets its own connect attempt within the deadline.
MAX_ADDRESSES = 3


class _Deadline:
    """One request's whole time limit. Socket timeouts bound each operation only (a receiver
    that trickles its headers would hold the attempt for ever): at the deadline a watchdog
    shuts the request's sockets down, and the blocked read fails at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            self.expired = True
            raise TimeoutError("the request's time is up")
        return left

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if not self.expired:
                return
        self._shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        # On the object, never on a bare descriptor: a closed or detached socket (the plain
        # one a TLS socket took over) has none, so nothing else is ever touched.
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class _Pinned:
    """A connection that goes to the vetted addresses, never to a fresh lookup of the host.

    The URL's host name stays in the Host header and, for HTTPS, in SNI and the certificate
    check (http.client wraps the socket with server_hostname=self.host); only the TCP connect
    is pinned, so a name re-pointed (DNS rebinding) after the check cannot redirect it. Its
    sockets are watched by the request's deadline.
    """

    def __init__(self, *args, addresses: list[IPAddress], deadline: _Deadline, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._vetted = addresses[:MAX_ADDRESSES]
        self._deadline = deadline
        self._create_connection = self._connect_vetted

    def _connect_vetted(self, address, timeout, source_address=None):
        _, port = address
        last: OSError | None = None
        for ip in self._vetted:
            try:
                wait = min(timeout, self._deadline.left())
                sock = socket.create_connection((str(ip), port), wait, source_address)
            except OSError as error:
                last = error
                continue
            self._deadline.watch(sock)  # the TLS handshake, if any, is cut at the deadline too
            return sock
        raise last or OSError("no address to connect to")

    def connect(self) -> None:
        super().connect()
        self._deadline.watch(self.sock)  # for HTTPS, the TLS socket that now owns the stream


class _PinnedHTTPConnection(_Pinned, http.client.HTTPConnection):
    pass


class _PinnedHTTPSConnection(_Pinned, http.client.HTTPSConnection):
    pass


class _PinnedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, addresses: list[IPAddress], deadline: _Deadline) -> None:
        super().__init__()
        self._pinned = {"addresses": addresses, "deadline": deadline}

    def http_open(self, req):
        return self.do_open(functools.partial(_PinnedHTTPConnection, **self._pinned), req)


class _PinnedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, addresses: list[IPAddress], deadline: _Deadline) -> None:
        super().__init__()
        self._pinned = {"addresses": addresses, "deadline": deadline}

    def https_open(self, req):
        return self.do_open(
            functools.partial(_PinnedHTTPSConnection, **self._pinned), req, context=_tls_context()
        )


def _tls_context() -> ssl.SSLContext:
    """The system's trusted CAs, with the certificate checked against the URL's host name."""
    return ssl.create_default_context()


def _opener(addresses: list[IPAddress], deadline: _Deadline) -> urllib.request.OpenerDirector:
    # No proxies from the environment, no redirects, and connections only to the vetted
    # addresses: the request goes where the admin said and the check allowed.
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        _NoRedirects,
        _PinnedHTTPHandler(addresses, deadline),
        _PinnedHTTPSHandler(addresses, deadline),
    )


def post(url: str, body: bytes, headers: dict[str, str]) -> Outcome:
    """One POST, no redirects followed, bounded by TIMEOUT_SECONDS from connect to status.

    The host is resolved once here and every address checked (unless private targets are
    allowed); the connection then goes to a checked address (at most MAX_ADDRESSES are
    tried). Name resolution is bounded by the system resolver, not by TIMEOUT_SECONDS. A
    refused target is a failed attempt like any other, so it is retried with backoff: a DNS
    change may fix it.
    """
    started = time.monotonic()
    timed_out = f"timed out after {TIMEOUT_SECONDS:g} s"

    def took() -> int:
        return int((time.monotonic() - started) * 1000)

    deadline = _Deadline(TIMEOUT_SECONDS)
    try:
        host, port = target(url)
        addresses, literal = addresses_of(host, port)
        refusal = refusal_for(host, addresses, literal)
        if refusal:
            return Outcome(False, None, f"refused: {refusal}", took())
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        with deadline, _opener(addresses, deadline).open(request, timeout=TIMEOUT_SECONDS) as r:
            code = r.status
    except (OSError, ValueError, http.client.HTTPException) as error:
        if deadline.expired:
            return Outcome(False, None, timed_out, took())
        return _failed(error, took(), timed_out)
    if deadline.expired:
        # The watchdog's shutdown can read as the end of the headers: not an answer.
        return Outcome(False, None, timed_out, took())
    return _answered(code, took())


def _failed(error: Exception, took: int, timed_out: str) -> Outcome:
    """What a POST that raised tells about the receiver (an HTTP error status included)."""
    if isinstance(error, WebhookURLError):
        return Outcome(False, None, str(error), took)
    if isinstance(error, Unresolvable):
        return Outcome(False, None, short_error(f"cannot connect: {error}"), took)
    if isinstance(error, urllib.error.HTTPError):
        error.close()
        return _answered(error.code, took)
    if isinstance(error, TimeoutError) or (
        isinstance(error, urllib.error.URLError) and isinstance(error.reason, TimeoutError)
    ):
        return Outcome(False, None, timed_out, took)
    if isinstance(error, urllib.error.URLError):
        return Outcome(False, None, short_error(f"cannot connect: {error.reason}"), took)
    return Outcome(False, None, short_error(f"{type(error).__name__}: {error}"), took)


def _answered(code: int, took: int) -> Outcome:
    if 200 <= code < 300:
        return Outcome(True, code, "", took)
    if 300 <= code < 400:
        return Outcome(False, code, f"HTTP {code}: redirects are not followed", took)
    return Outcome(False, code, f"HTTP {code}", took)
