"""The API's figures: a caller handing over its pause (POST /api/v1/runs/paused) to the web
processes, one request at a time and from concurrent clients, beside pause_run in-process."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agents import Runner

from api import tokens
from api.models import Scope
from approvals.execution import registry
from approvals.models import Tenant
from approvals.runs.pause import pause_run
from devtools import demo

SUBMIT_PATH = "/api/v1/runs/paused"


# --- distinct paused states -------------------------------------------------------------------


def paused_results(releases: list[str]) -> list:
    """One paused run of the release agent per release (its deploy_release call waits for an
    approval), each a RunResult as the caller's own process holds it."""
    spec = registry.get_spec("release", "1")

    async def all_of_them() -> list:
        # One agent per run: its scripted model answers one run's turns.
        return [
            await Runner.run(spec.build(), f"Deploy release {release} to production", context={})
            for release in releases
        ]

    results = asyncio.run(all_of_them())
    assert all(r.interruptions for r in results), "the release agent did not pause"
    return results


def submit_body(result) -> bytes:
    """The request a caller sends: its state as the pause measurements serialise it."""
    state = result.to_state().to_json(
        context_serializer=demo.release_context_serializer, strict_context=True
    )
    return json.dumps({"agent": "release", "version": "1", "state": state}).encode()


def bench_token(tenant: Tenant, requester) -> str:
    """A token of the tenant that may hand over runs, acting as the requester."""
    issued = tokens.issue(
        tenant=tenant,
        name="bench",
        scopes=[Scope.RUNS_WRITE],
        user=requester,
        channel="bench",
    )
    return issued.secret


# --- one client -------------------------------------------------------------------------------


@dataclass
class ApiConnection:
    """A kept-alive connection to one web process, sending the token on each request."""

    base_url: str
    secret: str
    timeout: float = 30
    _conn: http.client.HTTPConnection | None = field(default=None, repr=False)

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            parts = urllib.parse.urlsplit(self.base_url)
            self._conn = http.client.HTTPConnection(
                parts.hostname, parts.port, timeout=self.timeout
            )
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def post(self, path: str, body: bytes) -> tuple[int, str]:
        headers = {
            "Host": urllib.parse.urlsplit(self.base_url).netloc,
            "Authorization": f"Bearer {self.secret}",
            "Content-Type": "application/json",
        }
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request("POST", path, body=body, headers=headers)
                raw = conn.getresponse()
                text = raw.read().decode(errors="replace")
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # A kept-alive connection the server closed between requests: reconnect once.
                self.close()
                if attempt == 2:
                    raise
        if raw.getheader("Connection", "").lower() == "close":
            self.close()
        return raw.status, text


# --- the measures -----------------------------------------------------------------------------


def submit_one_at_a_time(
    urls: list[str], secret: str, bodies: list[bytes]
) -> tuple[list[float], Counter]:
    """Each body POSTed after the previous answer, the web processes in turn: the seconds from
    sending to the whole answer read, and the statuses."""
    conns = [ApiConnection(url, secret) for url in urls]
    seconds: list[float] = []
    statuses: Counter = Counter()
    try:
        for n, body in enumerate(bodies):
            started = time.perf_counter()
            status, text = conns[n % len(conns)].post(SUBMIT_PATH, body)
            seconds.append(time.perf_counter() - started)
            statuses[status] += 1
            if status != 201:
                raise RuntimeError(f"POST {SUBMIT_PATH} answered {status}: {text[:500]}")
    finally:
        for conn in conns:
            conn.close()
    return seconds, statuses


def submit_concurrently(
    urls: list[str], secret: str, bodies: list[bytes], *, clients: int
) -> dict[str, Any]:
    """`clients` threads, each with its own connection to one web process (in turn), share the
    bodies; submits per second from the first request sent to the last answer read."""
    shares = [bodies[n::clients] for n in range(clients)]
    statuses: Counter = Counter()
    errors: list[str] = []
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)

    def client(n: int) -> None:
        conn = ApiConnection(urls[n % len(urls)], secret)
        ready.wait()
        try:
            for body in shares[n]:
                status, text = conn.post(SUBMIT_PATH, body)
                with lock:
                    statuses[status] += 1
                    if status != 201 and len(errors) < 5:
                        errors.append(f"{status}: {text[:300]}")
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"POST {SUBMIT_PATH} refused: " + "; ".join(errors))
    return {
        "per_s": round(len(bodies) / seconds, 1),
        "requests": len(bodies),
        "seconds": round(seconds, 2),
        "clients": clients,
        "web_processes": len(urls),
        "statuses": {str(s): c for s, c in statuses.items()},
    }


def pause_run_seconds(tenant: Tenant, requester, results: list) -> list[float]:
    """pause_run in this process on the same kind of paused runs: the floor the API adds to."""
    seconds = []
    for result in results:
        started = time.perf_counter()
        pause_run(
            result, tenant=tenant, agent_key="release", agent_version="1", requested_by=requester
        )
        seconds.append(time.perf_counter() - started)
    return seconds
