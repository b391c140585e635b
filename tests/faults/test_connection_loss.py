"""The database connection cut in the middle of a decision and of a resume (PostgreSQL).

The process under test connects with `?application_name=<victim>` in its DATABASE_URL; the test
cuts it off from its own connection with pg_terminate_backend, at an exact moment:
- a decision: the test holds the tenant's row lock (which the audit append inside the decision
  waits for), so the server's backend is terminated with the ticket's UPDATE done but not
  committed;
- a resume: the worker runs as `manage.py shell -c` code that wraps the tool's effect (or the
  tool's entry into the ledger) to wait on a flag file; the backends are terminated while it
  waits, then the flag releases it.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from django.db import connection
from django_tasks_db.models import DBTaskResult

from approvals.audit import chain as audit
from approvals.decisions.decide import decide
from approvals.models import (
    AuditEvent,
    IdempotencyRecord,
    LedgerStatus,
    Run,
    RunStatus,
    Ticket,
    TicketStatus,
)
from approvals.runs.resolution import in_doubt_effects
from devtools import demo
from devtools.processes import ConsoleClient
from tests.conftest import database_url, subprocess_env
from tests.faults.conftest import (
    backends,
    blocked_by,
    no_traceback,
    require_postgres,
    row_locked,
    start_console,
    terminate_backends,
    with_application_name,
)
from tests.support import PASSWORD, TenantFactory, member, paused_run, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.faults, pytest.mark.slow]

RELEASE = "2026.07.24"
DONE_OUTPUT = f"Release {RELEASE}: Release {RELEASE} is live on production."
TERMINAL = {RunStatus.COMPLETED, RunStatus.NEEDS_ATTENTION, RunStatus.FAILED, RunStatus.EXPIRED}

# A db_worker whose tool waits on FAULT_FLAG_DIR/go at one point of the resume, after saying
# so in FAULT_FLAG_DIR/waiting. WAIT_IN is "effect" (inside the effect: the ledger key is
# claimed, not confirmed) or "ledger" (the tool's entry into the ledger: nothing claimed yet).
PAUSING_WORKER = """
import os, time
from pathlib import Path
from devtools import demo
from approvals.execution import ledger

flags = Path(os.environ["FAULT_FLAG_DIR"])

def hold():
    (flags / "waiting").touch()
    deadline = time.monotonic() + 60
    while not (flags / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)

def pausing(original):
    def wrapper(*args, **kwargs):
        hold()
        return original(*args, **kwargs)
    return wrapper

if os.environ["WAIT_IN"] == "effect":
    demo.record_effect = pausing(demo.record_effect)
else:
    ledger.perform = pausing(ledger.perform)

from django.core.management import call_command
call_command("db_worker", batch=True, startup_delay=False)
"""


def _people():
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, "viewer", username="dev-rita")
    approver = member(tenant, "approver", username="rm-alice")
    return tenant, requester, approver


def _actions(run: Run) -> list[str]:
    return list(
        AuditEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("action", flat=True)
    )


# --- a decision -------------------------------------------------------------------------------


def test_connection_cut_mid_decision_answers_503_changes_nothing_and_the_retry_works(
    processes, server_passwords
):
    require_postgres("pg_terminate_backend cuts one process's connection")
    tenant, requester, approver = _people()
    run = paused_run(tenant, requested_by=requester)
    ticket = Ticket.objects.get(run=run)
    victim = "victim-web"
    base_url, server = start_console(
        processes,
        env=subprocess_env(DATABASE_URL=with_application_name(database_url(), victim)),
    )
    client = ConsoleClient(base_url)
    client.login(approver.username, PASSWORD)
    assert client.get(f"/tickets/{ticket.pk}/").status == 200
    # After the sign-in (audited): the cut decision must add nothing.
    events_before = AuditEvent.objects.filter(tenant=tenant).count()

    answer: dict = {}
    decider = threading.Thread(target=lambda: answer.update(r=client.decide(ticket.pk)))
    # The decision's audit append waits for this lock, its ticket UPDATE already made.
    with row_locked("approvals_tenant", tenant.pk) as holder:
        decider.start()
        waiting = wait_until(
            lambda: [b for b in backends(victim) if b[2] == "Lock"],
            timeout=30,
            what="the server's decision to wait for the tenant's row lock",
        )
        # The decision's compare-and-set, waiting for the tenant's row and nothing else.
        assert "approvals_ticket" in waiting[0][3], waiting
        assert blocked_by(waiting[0][0]) == [holder], waiting
        killed = terminate_backends(victim)
    decider.join(timeout=30)

    assert killed >= 1
    response = answer["r"]
    assert response.status == 503, (response.status, response.body[:2000], server.tail())
    assert "Try again in a moment" in response.body
    assert response.headers.get("retry-after") == "5"
    assert no_traceback(response), response.body[:2000]
    assert "database unavailable during POST" in server.output()
    # Nothing of the decision was written.
    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.PENDING
    assert ticket.decided_by is None
    assert Run.objects.get(pk=run.pk).status == RunStatus.PAUSED
    assert AuditEvent.objects.filter(tenant=tenant).count() == events_before
    assert not AuditEvent.objects.filter(action="ticket.approved").exists()
    assert DBTaskResult.objects.count() == 0
    assert audit.verify_chain(tenant).ok

    retry = client.decide(ticket.pk)

    assert retry.status == 302, (retry.status, retry.body[:2000], server.tail())
    assert retry.headers["location"] == f"/runs/{run.pk}/"
    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.APPROVED
    assert ticket.decided_by_id == approver.pk
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    assert DBTaskResult.objects.count() == 1
    assert _actions(run)[-2:] == ["ticket.approved", "run.queued"]
    assert audit.verify_chain(tenant).ok
    assert demo.read_effects() == []
    client.close()


# --- a resume ---------------------------------------------------------------------------------


@pytest.mark.parametrize("wait_in", ["effect", "ledger"])
def test_connection_cut_mid_resume_leaves_the_run_to_the_reaper_and_loses_nothing(
    wait_in, processes, tmp_path, settings
):
    """wait_in="effect": cut between the ledger's claim and its confirmation. The effect happens
    once, its key stays claimed, and the next worker parks the run in needs_attention instead
    of repeating it.
    wait_in="ledger": cut after the run's claim, before the tool reaches the ledger. The tool's
    thread opens a fresh connection, so the effect happens and is confirmed, but the worker
    cannot store the outcome; the next worker completes the run from the ledger's stored result,
    with no second effect.
    Either way the dying worker leaves the run resuming under a lease that expires, and a
    `manage.py worker` (reaper + db_worker) picks it up by itself.
    """
    require_postgres("pg_terminate_backend cuts one process's connection")
    tenant, requester, approver = _people()
    run = paused_run(tenant, requested_by=requester)
    decide(Ticket.objects.get(run=run), user=approver, approve=True)
    victim = f"victim-worker-{wait_in}"
    flags = tmp_path / "flags"
    flags.mkdir()
    dying = processes(
        "victim",
        "shell",
        "-c",
        PAUSING_WORKER,
        env=subprocess_env(
            DATABASE_URL=with_application_name(database_url(), victim),
            FAULT_FLAG_DIR=str(flags),
            WAIT_IN=wait_in,
            APPROVALS_LEASE_SECONDS="2",
        ),
    )
    wait_until(
        lambda: (flags / "waiting").exists() or dying.popen.poll() is not None,
        timeout=60,
        what=f"the worker to reach the {wait_in}",
    )
    assert dying.popen.poll() is None, dying.tail()
    run.refresh_from_db()
    assert run.status == RunStatus.RESUMING
    assert run.lease_owner.endswith(f":{dying.pid}")
    claimed = list(IdempotencyRecord.objects.values_list("status", flat=True))
    assert claimed == ([LedgerStatus.CLAIMED] if wait_in == "effect" else [])

    killed = terminate_backends(victim)
    Path(flags / "go").touch()
    code = dying.popen.wait(timeout=60)

    assert killed >= 1
    log = dying.output()
    assert "terminating connection due to administrator command" in log, log[-3000:]
    # Storing the outcome failed with the connection; db_worker recorded its task as failed on a
    # fresh connection and, in --batch mode, exited normally.
    assert code == 0, log[-3000:]
    assert list(DBTaskResult.objects.values_list("status", flat=True)) == ["FAILED"]
    effects = demo.read_effects("deploy_release")
    assert [e["pid"] for e in effects] == [dying.pid]
    run.refresh_from_db()
    assert run.status == RunStatus.RESUMING, (run.status, run.status_reason)
    assert run.attempts == 1
    ledger_rows = list(IdempotencyRecord.objects.values_list("status", flat=True))
    # The ledger row says which of the two outcomes the next worker must reach.
    if wait_in == "effect":
        assert ledger_rows == [LedgerStatus.CLAIMED]
    else:
        assert ledger_rows == [LedgerStatus.DONE]

    rescuer = processes(
        "rescuer",
        "worker",
        "--interval",
        "0.2",
        env=subprocess_env(APPROVALS_LEASE_SECONDS="2", APPROVALS_REAPER_INTERVAL_SECONDS="1"),
    )
    wait_until(
        lambda: Run.objects.filter(pk=run.pk, status__in=TERMINAL).exists(),
        timeout=60,
        what="the next worker to reap and finish the run",
    )

    run.refresh_from_db()
    assert run.attempts == 2
    assert len(demo.read_effects("deploy_release")) == 1, rescuer.tail()
    actions = _actions(run)
    assert actions.count("run.requeued") == 1
    assert actions.count("run.resuming") == 2
    record = IdempotencyRecord.objects.get(run=run)
    if wait_in == "effect":
        assert record.status == LedgerStatus.CLAIMED
        assert run.status == RunStatus.NEEDS_ATTENTION, (run.status, run.status_reason)
        assert "never confirmed" in run.status_reason
        assert actions[-1] == "run.in_doubt"
        assert "effect.done" not in actions
        assert [r.pk for r in in_doubt_effects(run)] == [record.pk]
    else:
        assert record.status == LedgerStatus.DONE
        assert run.status == RunStatus.COMPLETED, (run.status, run.status_reason)
        assert run.final_output == DONE_OUTPUT
        assert actions.count("effect.done") == 1
        assert actions[-1] == "run.completed"
    assert audit.verify_chain(tenant).ok
    print(
        f"\n[faults] connection cut in {wait_in}: {killed} backend(s) terminated; dying worker "
        f"exit {code}, its task FAILED; next worker left the run {run.status} with ledger {record.status}; "
        f"effects {len(demo.read_effects('deploy_release'))}"
    )


def test_only_the_tools_connection_cut_after_the_effect_parks_the_run_in_needs_attention(
    processes, tmp_path
):
    """Only the connection of the tool's thread is cut, while the effect runs: the effect
    happens, its confirmation cannot be stored, and the worker's own connection still works.

    Expected (guarantee 8: an effect whose outcome is unknown parks the run): the worker itself
    parks the run in needs_attention with the key still claimed, one effect, and the in-doubt
    effect offered to an admin. A run marked "failed" here would hide an effect that happened.
    """
    require_postgres("pg_terminate_backend cuts one process's connection")
    tenant, requester, approver = _people()
    run = paused_run(tenant, requested_by=requester)
    decide(Ticket.objects.get(run=run), user=approver, approve=True)
    victim = "victim-worker-tool"
    flags = tmp_path / "flags"
    flags.mkdir()
    dying = processes(
        "victim",
        "shell",
        "-c",
        PAUSING_WORKER,
        env=subprocess_env(
            DATABASE_URL=with_application_name(database_url(), victim),
            FAULT_FLAG_DIR=str(flags),
            WAIT_IN="effect",
        ),
    )
    wait_until(
        lambda: (flags / "waiting").exists() or dying.popen.poll() is not None,
        timeout=60,
        what="the worker to reach the effect",
    )
    assert dying.popen.poll() is None, dying.tail()
    # The tool's thread claimed the key with one INSERT on a connection of its own, which
    # committed on its own; the worker's main connection last read a membership.
    tool_backends = [
        pid
        for pid, _, _, query in backends(victim)
        if query.startswith('INSERT INTO "approvals_idempotencyrecord"')
    ]
    assert len(tool_backends) == 1, backends(victim)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", tool_backends)
    Path(flags / "go").touch()
    code = dying.popen.wait(timeout=60)

    assert code == 0, dying.tail()
    assert [e["pid"] for e in demo.read_effects("deploy_release")] == [dying.pid]
    record = IdempotencyRecord.objects.get(run=run)
    assert record.status == LedgerStatus.CLAIMED
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION, (run.status, run.status_reason)
    assert [r.pk for r in in_doubt_effects(run)] == [record.pk]
    assert "effect.done" not in _actions(run)
    assert audit.verify_chain(tenant).ok
