"""1,000 tickets approved over HTTP by 20 concurrent people while 2 workers resume (PostgreSQL).

The real console: `manage.py runserver --noreload` (daphne, ASGI) and two `manage.py worker
--interval 0.2` processes against the test database. The people are 20 threads on the standard
library's http.client, each signed in as its own approver (login page for the CSRF cookie, POST
/login/, then every decision POSTed with the csrftoken cookie as X-CSRFToken).

The 1,000 paused runs are made by the release agent itself (tests.support.paused_run), each
for its own release, so that each effect-log line names the run it came from. Cloning one paused
run per tenant was measured and dropped: the SDK's state records a fingerprint of each tool call's
arguments (`tool_invocations`), so a clone whose arguments were edited (and re-sealed, with the
ticket's canonical arguments and digest recomputed) is refused at resume with ModelBehaviorError
"Model reused a tool call ID for a different invocation"; and the agent is fast enough
(~22 ms a run on the 2-core test machine, ~25 s for 1,000).

Expected: 1,000 decisions answered 302; 1,000 effects, no release twice (0 duplicates) and none
missing (0 lost); every run completed after one attempt; one done ledger row per run; each
tenant's audit chain verifies.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from approvals.audit import chain as audit
from approvals.models import (
    AuditEvent,
    IdempotencyRecord,
    LedgerStatus,
    Membership,
    Role,
    Run,
    RunStatus,
    Tenant,
    Ticket,
    TicketStatus,
)
from devtools import demo
from devtools.processes import ConsoleClient
from tests.conftest import subprocess_env
from tests.faults.conftest import require_postgres, start_console
from tests.support import PASSWORD, TenantFactory, UserFactory, member, paused_run, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.faults, pytest.mark.slow]

TENANTS = 4
RUNS_PER_TENANT = 250
CLIENTS = 20
WORKERS = 2
COMPLETION_DEADLINE = 420


def _approve_all(
    base_url: str,
    username: str,
    ticket_ids: list[int],
    signed_in: threading.Barrier,
    results: dict,
    errors: list,
):
    client = ConsoleClient(base_url)
    try:
        try:
            client.login(username, PASSWORD)
        finally:
            signed_in.wait(timeout=COMPLETION_DEADLINE)
        for ticket_id in ticket_ids:
            started = time.monotonic()
            response = client.decide(ticket_id)
            results[ticket_id] = (response.status, time.monotonic() - started)
    except Exception as error:  # reported by the test, with the thread's name
        errors.append(f"{username}: {type(error).__name__}: {error}")
    finally:
        client.close()


def test_1000_tickets_approved_by_20_clients_while_2_workers_resume(processes, server_passwords):
    require_postgres(
        "1,000 runs under concurrent writers: row locks; SQLite serialises every writer"
    )
    built = time.monotonic()
    releases: dict[int, str] = {}
    for index in range(TENANTS):
        tenant = TenantFactory(slug=f"load{index}")
        requester = member(tenant, "viewer", username=f"dev-{index}")
        for number in range(RUNS_PER_TENANT):
            release = f"2026.{index + 1:02d}.01-n{number:04d}"
            run = paused_run(
                tenant, requested_by=requester, prompt=f"Deploy release {release} to production"
            )
            releases[run.pk] = release
    approvers = [UserFactory(username=f"rm-{n:02d}", password=PASSWORD) for n in range(CLIENTS)]
    Membership.objects.bulk_create(
        Membership(user=user, tenant=tenant, role=Role.APPROVER)
        for user in approvers
        for tenant in Tenant.objects.all()
    )
    built = time.monotonic() - built
    ticket_ids = list(Ticket.objects.order_by("pk").values_list("pk", flat=True))
    assert len(ticket_ids) == len(releases) == TENANTS * RUNS_PER_TENANT
    assert Ticket.objects.filter(status=TicketStatus.PENDING).count() == len(ticket_ids)

    base_url, server = start_console(processes)
    workers = [
        processes("worker", "worker", "--interval", "0.2", env=subprocess_env(LOG_LEVEL="INFO"))
        for _ in range(WORKERS)
    ]
    results: dict[int, tuple[int, float]] = {}
    errors: list[str] = []
    signed_in = threading.Barrier(CLIENTS + 1)
    threads = [
        threading.Thread(
            target=_approve_all,
            args=(base_url, user.username, ticket_ids[n::CLIENTS], signed_in, results, errors),
            name=user.username,
        )
        for n, user in enumerate(approvers)
    ]
    logins = time.monotonic()
    for thread in threads:
        thread.start()
    # Each first sign-in re-hashes the password at the server's cost (~1 s of its one thread);
    # that is timed apart from the decisions.
    signed_in.wait(timeout=COMPLETION_DEADLINE)
    started = time.monotonic()
    logins = started - logins
    for thread in threads:
        thread.join(timeout=COMPLETION_DEADLINE)
    decided = time.monotonic() - started

    assert errors == [], errors + [server.tail()]
    statuses = Counter(status for status, _ in results.values())
    assert statuses == {302: len(ticket_ids)}, (statuses, server.tail())
    wait_until(
        lambda: (
            not Run.objects.exclude(status=RunStatus.COMPLETED)
            .exclude(status__in=[RunStatus.FAILED, RunStatus.NEEDS_ATTENTION])
            .exists()
        ),
        timeout=COMPLETION_DEADLINE,
        what="every approved run to finish",
        every=0.5,
    )
    finished = time.monotonic() - started

    assert all(w.popen.poll() is None for w in workers), [w.tail() for w in workers]
    stuck = list(
        Run.objects.exclude(status=RunStatus.COMPLETED).values_list("pk", "status", "status_reason")
    )
    assert stuck == [], stuck[:5]
    effects = demo.read_effects("deploy_release")
    counts = Counter(e["release"] for e in effects)
    duplicates = {name: n for name, n in counts.items() if n > 1}
    lost = set(releases.values()) - set(counts)
    assert len(effects) == len(releases)
    assert duplicates == {}
    assert lost == set()
    assert Ticket.objects.filter(status=TicketStatus.APPROVED).count() == len(ticket_ids)
    assert set(Run.objects.values_list("attempts", flat=True)) == {1}
    assert IdempotencyRecord.objects.filter(status=LedgerStatus.DONE).count() == len(releases)
    assert IdempotencyRecord.objects.exclude(status=LedgerStatus.DONE).count() == 0
    assert AuditEvent.objects.filter(action="effect.done").count() == len(releases)
    for tenant in Tenant.objects.all():
        report = audit.verify_chain(tenant)
        assert report.ok, report
    latencies = sorted(seconds for _, seconds in results.values())
    by_pid = Counter(e["pid"] for e in effects)
    print(
        f"\n[faults] load: {len(releases)} runs built in {built:.1f}s; {CLIENTS} sign-ins in "
        f"{logins:.1f}s; "
        f"{len(ticket_ids)} decisions by {CLIENTS} clients in {decided:.1f}s "
        f"({len(ticket_ids) / decided:.1f}/s, p50 {latencies[len(latencies) // 2] * 1000:.0f} ms, "
        f"p95 {latencies[int(len(latencies) * 0.95)] * 1000:.0f} ms); all runs completed "
        f"{finished:.1f}s after the first decision ({len(releases) / finished:.1f} runs/s); "
        f"effects per worker pid {dict(by_pid)}; 0 duplicates, 0 lost"
    )
