"""Redis down while the console runs: pages and decisions carry on, only live hints stop.

A private `redis-server` on a free port is the channel layer of the server (`manage.py
runserver --noreload`, daphne) and of the worker (`manage.py worker`), both via REDIS_URL.
First, with Redis up, a signed-in websocket to /ws/console/ is upgraded (101): the control.
Then Redis is SIGKILLed. Expected: the queue, ticket and run pages answer 200, the decision
answers 302, the worker completes the run with one effect and nothing is lost from the audit
chain; the server logs the undelivered live hint; and the live channel degrades: a websocket
is no longer upgraded (the console's pages then show "Offline" with JavaScript, which is the
browser tests' business: here it is asserted on the server side).
"""

from __future__ import annotations

import base64
import os
import socket
import time
import urllib.parse

import pytest

from approvals.audit import chain as audit
from approvals.models import AuditEvent, IdempotencyRecord, LedgerStatus, Run, RunStatus, Ticket
from devtools import demo
from devtools.processes import ConsoleClient
from tests.conftest import subprocess_env
from tests.faults.conftest import free_port, start_console
from tests.support import PASSWORD, TenantFactory, member, paused_run, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.faults, pytest.mark.slow]

REDIS_SERVER = "/usr/bin/redis-server"
WS_TIMEOUT = 15


def _redis_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _websocket_status(base_url: str, cookies: dict[str, str]) -> tuple[int | None, str]:
    """The status of a websocket upgrade of /ws/console/ (101 when accepted), or None when the
    server closed the connection without an answer; and the raw head of the answer."""
    parts = urllib.parse.urlsplit(base_url)
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        "GET /ws/console/ HTTP/1.1\r\n"
        f"Host: {parts.netloc}\r\n"
        "Upgrade: websocket\r\n"
        "Connection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n"
        f"Origin: {base_url}\r\n"
        f"Cookie: {'; '.join(f'{k}={v}' for k, v in cookies.items())}\r\n\r\n"
    )
    with socket.create_connection((parts.hostname, parts.port), timeout=WS_TIMEOUT) as sock:
        sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
    text = head.decode(errors="replace")
    if not text:
        return None, ""
    return int(text.split(" ", 2)[1]), text


def test_redis_killed_pages_and_decisions_still_work_and_live_channel_degrades(
    processes, server_passwords
):
    if not os.path.exists(REDIS_SERVER):
        pytest.skip(f"redis-server not installed at {REDIS_SERVER}: apt-get install redis-server")
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, "viewer", username="dev-rita")
    approver = member(tenant, "approver", username="rm-alice")
    run = paused_run(tenant, requested_by=requester)
    ticket = Ticket.objects.get(run=run)

    port = free_port()
    redis = processes(
        "redis",
        REDIS_SERVER,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
    )
    wait_until(lambda: _redis_answers(port), timeout=20, what="redis-server to answer PING")
    env = subprocess_env(REDIS_URL=f"redis://127.0.0.1:{port}/0", LOG_LEVEL="INFO")
    base_url, server = start_console(processes, env=env)
    worker = processes("worker", "worker", "--interval", "0.2", env=env)
    client = ConsoleClient(base_url)
    client.login(approver.username, PASSWORD)
    up_status, up_head = _websocket_status(base_url, client.cookies)
    assert up_status == 101, (up_head, server.tail())

    redis.popen.kill()
    redis.popen.wait(timeout=10)
    assert not _redis_answers(port)

    for path in ("/", f"/tickets/{ticket.pk}/", f"/runs/{run.pk}/"):
        page = client.get(path)
        assert page.status == 200, (path, page.status, server.tail())
    assert f"/tickets/{ticket.pk}/" in client.get("/").body
    started = time.monotonic()
    decision = client.decide(ticket.pk)
    decided_in = time.monotonic() - started
    assert decision.status == 302, (decision.status, decision.body[:2000], server.tail())
    assert decision.headers["location"] == f"/runs/{run.pk}/"
    assert client.get(f"/runs/{run.pk}/").status == 200

    wait_until(
        lambda: Run.objects.filter(
            pk=run.pk, status__in=[RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.NEEDS_ATTENTION]
        ).exists(),
        timeout=60,
        what="the worker to finish the run without Redis",
    )
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, (run.status, run.status_reason, worker.tail())
    assert run.attempts == 1
    assert len(demo.read_effects("deploy_release")) == 1
    assert list(IdempotencyRecord.objects.values_list("status", flat=True)) == [LedgerStatus.DONE]
    actions = list(
        AuditEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("action", flat=True)
    )
    assert actions == [
        "run.paused",
        "ticket.created",
        "ticket.approved",
        "run.queued",
        "run.resuming",
        "effect.done",
        "run.completed",
    ]
    assert audit.verify_chain(tenant).ok
    assert client.get(f"/runs/{run.pk}/").status == 200
    # The hints the decision and the worker could not send are logged, not raised.
    assert "not delivered" in server.output(), server.tail()
    assert "not delivered" in worker.output(), worker.tail()

    try:
        down_status, down_head = _websocket_status(base_url, client.cookies)
    except TimeoutError:
        down_status, down_head = None, f"no answer in {WS_TIMEOUT}s"
    assert down_status != 101, (down_head, server.tail())
    assert server.popen.poll() is None and worker.popen.poll() is None
    client.close()
    print(
        f"\n[faults] redis down: pages 200, decision 302 in {decided_in * 1000:.0f} ms, run "
        f"completed with 1 effect; websocket upgrade {up_status} before, "
        f"{down_status or 'closed'} after ({down_head.splitlines()[0] if down_head else ''})"
    )
