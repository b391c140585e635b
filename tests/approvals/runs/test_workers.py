"""Real worker processes and threads against the test database: S2 across processes, S5 crashes.

Every test here starts `manage.py` processes (or threads with their own connections) and asserts
facts: effect-log lines, ledger rows, run status and attempts, audit actions, exit codes. Waits
poll the database with a deadline; a sleep is never the assertion.
"""

from __future__ import annotations

import signal
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.audit import chain as audit
from approvals.decisions.decide import decide
from approvals.decisions.errors import AlreadyDecidedError, TicketExpiredError
from approvals.execution.queue import resume_run_task
from approvals.execution.state import open_state
from approvals.models import (
    AuditEvent,
    IdempotencyRecord,
    LedgerStatus,
    Run,
    RunStatus,
    Ticket,
    TicketStatus,
)
from approvals.runs.reaper import reap
from approvals.runs.resume import resume
from devtools import demo
from tests.conftest import subprocess_env
from tests.support import TenantFactory, member, paused_run, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RELEASE = "2026.07.24"
PROMPT = f"Deploy release {RELEASE} to production"
DONE_OUTPUT = f"Release {RELEASE}: Release {RELEASE} is live on production."
DENIED = "Deployment was denied by the release manager."
RESUME_TASK = "approvals.execution.queue.resume_run_task"
# A process started by Popen and killed by SIGKILL reports the negative signal number.
KILLED = -signal.SIGKILL
# A worker process that dies after the run's lease was taken but before the tool reaches the
# ledger: the tool's entry into the ledger kills the process, so no key is ever claimed.
DIE_BEFORE_CLAIM = """
import os, signal
from approvals.execution import ledger
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
ledger.perform = die
from django.core.management import call_command
call_command("db_worker", batch=True, startup_delay=False)
"""


# --- helpers ------------------------------------------------------------------------------------


def _finished(process, *, timeout: float = 60) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def _actions(run: Run) -> list[str]:
    return list(
        AuditEvent.objects.filter(run_id=run.pk).order_by("seq").values_list("action", flat=True)
    )


def _resume_tasks():
    return DBTaskResult.objects.filter(task_path=RESUME_TASK)


def _lease_expired(run: Run) -> bool:
    lease = Run.objects.values_list("lease_expires_at", flat=True).get(pk=run.pk)
    return lease is not None and lease < timezone.now()


def _people():
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, "viewer", username="dev-rita")
    approver = member(tenant, "approver", username="rm-alice")
    return tenant, requester, approver


def _approved_run(*, prompt: str = PROMPT) -> tuple[Run, Ticket]:
    """A run paused in this process and approved in this process: one resume task queued."""
    tenant, requester, approver = _people()
    run = paused_run(tenant, requested_by=requester, prompt=prompt)
    ticket = Ticket.objects.get(run=run)
    decide(ticket, user=approver, approve=True)
    assert _resume_tasks().count() == 1
    assert demo.read_effects() == []
    return run, ticket


def _worker(manage_process, **env: str):
    return manage_process("db_worker", "--batch", "--no-startup-delay", env=subprocess_env(**env))


# --- S2 across processes --------------------------------------------------------------------------


def test_approval_in_another_process_resumes_in_a_third_with_one_effect(manage_process):
    """Pause here, approve in `manage.py decide`, resume in `manage.py db_worker`: one effect."""
    tenant, requester, approver = _people()
    run = paused_run(tenant, requested_by=requester)
    ticket = Ticket.objects.get(run=run)
    assert demo.read_effects() == []

    decider = manage_process("decide", str(ticket.pk), "--approve", "--user", "rm-alice")
    code, out, err = _finished(decider)

    assert code == 0, err
    assert out.strip() == f"ticket {ticket.pk} approved by rm-alice; run {run.pk} is queued"
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    assert _resume_tasks().count() == 1
    assert demo.read_effects() == []

    worker = _worker(manage_process)
    code, _, err = _finished(worker)

    assert code == 0, err
    effects = demo.read_effects("deploy_release")
    assert [(e["release"], e["environment"], e["pid"]) for e in effects] == [
        (RELEASE, "production", worker.pid)
    ]
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.attempts == 1
    assert run.final_output == DONE_OUTPUT
    assert IdempotencyRecord.objects.filter(run=run).count() == 1
    assert IdempotencyRecord.objects.get(run=run).status == LedgerStatus.DONE
    assert list(_resume_tasks().values_list("status", flat=True)) == ["SUCCESSFUL"]
    assert _actions(run) == [
        "run.paused",
        "ticket.created",
        "ticket.approved",
        "run.queued",
        "run.resuming",
        "effect.done",
        "run.completed",
    ]
    assert AuditEvent.objects.get(action="ticket.approved").actor_id == approver.pk


def test_rejection_in_another_process_never_runs_the_tool_and_run_completes(manage_process):
    """Reject in `manage.py decide --message`: no effect, the model gets the message, run ends."""
    tenant, requester, _ = _people()
    run = paused_run(tenant, requested_by=requester)
    ticket = Ticket.objects.get(run=run)

    decider = manage_process(
        "decide", str(ticket.pk), "--reject", "--user", "rm-alice", "--message", DENIED
    )
    code, out, err = _finished(decider)

    assert code == 0, err
    assert out.strip() == f"ticket {ticket.pk} rejected by rm-alice; run {run.pk} is queued"

    code, _, err = _finished(_worker(manage_process))

    assert code == 0, err
    assert demo.read_effects() == []
    assert IdempotencyRecord.objects.count() == 0
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.final_output == f"Release {RELEASE}: {DENIED}"
    assert Ticket.objects.get(pk=ticket.pk).decision_message == DENIED
    assert _actions(run)[-3:] == ["run.queued", "run.resuming", "run.completed"]


# --- at-least-once delivery -----------------------------------------------------------------------


def test_resume_delivered_twice_to_two_worker_processes_runs_the_tool_once(manage_process):
    """Two resume tasks for one approved run, two db_workers started at once.

    Expected: one claim (attempts 1, one run.resuming), one effect, one done ledger row; both
    tasks finish successfully, the second having found the run claimed or already completed.
    """
    run, _ = _approved_run()
    resume_run_task.enqueue(run.pk)
    assert _resume_tasks().count() == 2

    workers = [_worker(manage_process) for _ in range(2)]
    results = [_finished(w) for w in workers]

    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    assert len(demo.read_effects("deploy_release")) == 1
    assert list(IdempotencyRecord.objects.values_list("status", flat=True)) == [LedgerStatus.DONE]
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.attempts == 1
    assert run.final_output == DONE_OUTPUT
    assert sorted(_resume_tasks().values_list("status", flat=True)) == ["SUCCESSFUL"] * 2
    assert _actions(run).count("run.resuming") == 1
    assert _actions(run).count("effect.done") == 1
    assert audit.verify_chain(run.tenant).ok


# --- concurrent decisions ------------------------------------------------------------------------


def test_two_approvers_deciding_at_the_same_moment_one_wins():
    """Two threads, two connections, one barrier: one approval lands, the other is told who won."""
    tenant, requester, _ = _people()
    approvers = [
        member(tenant, "approver", username="rm-alice"),
        member(tenant, "admin", username="rm-bob"),
    ]
    run = paused_run(tenant, requested_by=requester)
    barrier = threading.Barrier(len(approvers))
    results: dict[str, object] = {}

    def decide_as(user) -> None:
        try:
            ticket = Ticket.objects.get(run_id=run.pk)
            barrier.wait(timeout=10)
            results[user.username] = decide(ticket, user=user, approve=True)
        except Exception as error:
            results[user.username] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=decide_as, args=(user,)) for user in approvers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    winners = [name for name, r in results.items() if isinstance(r, Ticket)]
    losers = [r for r in results.values() if not isinstance(r, Ticket)]
    assert len(winners) == 1, results
    assert len(losers) == 1, results
    assert isinstance(losers[0], AlreadyDecidedError), repr(losers[0])
    assert str(losers[0]).startswith(f"Already approved by {winners[0]} at ")
    ticket = Ticket.objects.select_related("decided_by").get(run=run)
    assert ticket.status == TicketStatus.APPROVED
    assert ticket.decided_by.username == winners[0]
    assert _resume_tasks().count() == 1
    assert _actions(run).count("ticket.approved") == 1
    assert _actions(run).count("run.queued") == 1
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    assert audit.verify_chain(tenant).ok


# --- S5: SIGKILL in the middle of a resume ------------------------------------------------------


def test_worker_killed_after_ledger_claim_parks_the_run_needs_attention(manage_process, settings):
    """APPROVALS_FAULT=after_claim: killed after the key is claimed, before the effect.

    Expected: exit -9, no effect, a claimed ledger row, run stuck resuming. Once the lease has
    expired the reaper requeues it; the next worker finds the claim in doubt and parks the run
    in needs_attention with a reason. The effect never happens: nobody knows if it did.
    """
    settings.APPROVALS_LEASE_SECONDS = 2
    run, _ = _approved_run()

    code, _, err = _finished(
        _worker(manage_process, APPROVALS_FAULT="after_claim", APPROVALS_LEASE_SECONDS="2")
    )

    assert code == KILLED, err
    assert demo.read_effects() == []
    run.refresh_from_db()
    assert run.status == RunStatus.RESUMING
    assert run.attempts == 1
    assert list(IdempotencyRecord.objects.values_list("status", flat=True)) == [
        LedgerStatus.CLAIMED
    ]

    wait_until(lambda: _lease_expired(run), timeout=10, what="the dead worker's lease to expire")
    report = reap()

    assert report.requeued == [run.pk]
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED

    code, _, err = _finished(_worker(manage_process))

    assert code == 0, err
    assert demo.read_effects() == []
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION
    assert run.attempts == 2
    assert f"deploy_release on {RELEASE}@production was started by attempt " in run.status_reason
    assert "never confirmed (claimed)" in run.status_reason
    assert list(IdempotencyRecord.objects.values_list("status", flat=True)) == [
        LedgerStatus.CLAIMED
    ]
    assert _actions(run)[-4:] == ["run.resuming", "run.requeued", "run.resuming", "run.in_doubt"]
    assert audit.verify_chain(run.tenant).ok


def test_worker_killed_after_effect_never_repeats_it(manage_process, settings):
    """APPROVALS_FAULT=after_effect: killed after the effect, before the ledger says done.

    Expected: exit -9 with exactly one effect and the key still claimed. The reaper requeues
    the run once the lease expired; the next worker parks it in needs_attention, and the effect
    count stays at one.
    """
    settings.APPROVALS_LEASE_SECONDS = 2
    run, _ = _approved_run()

    worker = _worker(manage_process, APPROVALS_FAULT="after_effect", APPROVALS_LEASE_SECONDS="2")
    code, _, err = _finished(worker)

    assert code == KILLED, err
    assert [e["pid"] for e in demo.read_effects("deploy_release")] == [worker.pid]
    assert Run.objects.get(pk=run.pk).status == RunStatus.RESUMING
    assert list(IdempotencyRecord.objects.values_list("status", flat=True)) == [
        LedgerStatus.CLAIMED
    ]

    wait_until(lambda: _lease_expired(run), timeout=10, what="the dead worker's lease to expire")
    assert reap().requeued == [run.pk]

    code, _, err = _finished(_worker(manage_process))

    assert code == 0, err
    assert [e["pid"] for e in demo.read_effects("deploy_release")] == [worker.pid]
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION
    assert run.attempts == 2
    assert "never confirmed" in run.status_reason
    assert IdempotencyRecord.objects.count() == 1
    assert _actions(run)[-2:] == ["run.resuming", "run.in_doubt"]
    # The effect happened, but nothing ever confirmed it: the log must not say it did.
    assert "effect.done" not in _actions(run)


def test_worker_killed_before_ledger_claim_is_resumed_by_the_next_worker(manage_process, settings):
    """A db_worker SIGKILLed holding the lease, before its tool reached the ledger.

    Expected: exit -9, no effect, no ledger row, run resuming and its task left RUNNING. The
    reaper requeues it once the lease expired (nothing is in doubt), and the next worker
    completes it with exactly one effect.
    """
    settings.APPROVALS_LEASE_SECONDS = 2
    run, _ = _approved_run()

    dying = manage_process(
        "shell", "-c", DIE_BEFORE_CLAIM, env=subprocess_env(APPROVALS_LEASE_SECONDS="2")
    )
    code, _, err = _finished(dying)

    assert code == KILLED, err
    assert demo.read_effects() == []
    assert IdempotencyRecord.objects.count() == 0
    run.refresh_from_db()
    assert run.status == RunStatus.RESUMING
    assert run.attempts == 1
    assert run.lease_owner.endswith(f":{dying.pid}")
    assert list(_resume_tasks().values_list("status", flat=True)) == ["RUNNING"]

    wait_until(lambda: _lease_expired(run), timeout=10, what="the dead worker's lease to expire")
    assert reap().requeued == [run.pk]
    worker = _worker(manage_process)
    code, _, err = _finished(worker)

    assert code == 0, err
    assert [e["pid"] for e in demo.read_effects("deploy_release")] == [worker.pid]
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.attempts == 2
    assert run.final_output == DONE_OUTPUT
    assert list(IdempotencyRecord.objects.values_list("status", flat=True)) == [LedgerStatus.DONE]
    assert _actions(run)[-5:] == [
        "run.resuming",
        "run.requeued",
        "run.resuming",
        "effect.done",
        "run.completed",
    ]


def test_worker_killed_while_storing_a_new_pause_leaves_the_previous_checkpoint(manage_process):
    """APPROVALS_FAULT=while_storing_pause: the staging deploy ran, the production pause is cut.

    Expected: exit -9; the new checkpoint's transaction never commits, so the run keeps its
    first state (generation 1, one ticket) and the staging key is done. Requeued and resumed,
    the staging deploy returns its stored result (no second effect) and the run pauses for the
    production deploy with a new ticket. (The second attempt runs in this process: what is
    checked here is the checkpoint the dead process left, not the worker.)
    """
    run, _ = _approved_run(prompt=f"Deploy release {RELEASE} to staging and production")

    worker = _worker(manage_process, APPROVALS_FAULT="while_storing_pause")
    code, _, err = _finished(worker)

    assert code == KILLED, err
    assert [e["environment"] for e in demo.read_effects("deploy_release")] == ["staging"]
    run.refresh_from_db()
    assert run.status == RunStatus.RESUMING
    assert run.state_generation == 1
    assert Ticket.objects.filter(run=run).count() == 1
    assert open_state(run)["$schemaVersion"] == run.schema_version
    assert list(IdempotencyRecord.objects.values_list("status", flat=True)) == [LedgerStatus.DONE]

    # Expire the dead worker's lease (60 s by default) instead of waiting for it.
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert reap().requeued == [run.pk]
    outcome = resume(run_id=run.pk, worker_id="test-worker")

    assert outcome.status == RunStatus.PAUSED
    assert [e["environment"] for e in demo.read_effects("deploy_release")] == ["staging"]
    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED
    assert run.attempts == 2
    assert run.state_generation == 2
    pending = Ticket.objects.get(run=run, status=TicketStatus.PENDING)
    assert pending.generation == 2
    assert pending.arguments_json == ('{"environment":"production","release":"' + RELEASE + '"}')


def test_worker_command_reaps_and_resumes_a_dead_workers_run_by_itself(manage_process):
    """`manage.py worker` (db_worker + reaper thread) recovers a run whose worker died.

    The state a killed db_worker leaves: its task RUNNING forever, the run resuming under a
    lease that has expired, no ledger row. Expected: within the deadline the worker's reaper
    requeues the run and its db_worker completes it with one effect.
    """
    run, _ = _approved_run()
    _resume_tasks().get().claim("dead-db-worker")
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RESUMING,
        lease_owner="deadhost:4242",
        lease_expires_at=timezone.now() - timedelta(seconds=1),
        attempts=1,
    )

    worker = manage_process(
        "worker",
        env=subprocess_env(APPROVALS_LEASE_SECONDS="2", APPROVALS_REAPER_INTERVAL_SECONDS="1"),
    )
    wait_until(
        lambda: Run.objects.filter(pk=run.pk, status=RunStatus.COMPLETED).exists(),
        timeout=40,
        what="the worker to recover and complete the run",
    )

    assert worker.poll() is None
    assert [e["pid"] for e in demo.read_effects("deploy_release")] == [worker.pid]
    run.refresh_from_db()
    assert run.attempts == 2
    assert run.final_output == DONE_OUTPUT
    requeued = AuditEvent.objects.get(run_id=run.pk, action="run.requeued")
    assert requeued.actor_name == "reaper"
    assert requeued.detail == {"reason": "worker deadhost:4242 stopped renewing its lease"}
    assert list(IdempotencyRecord.objects.values_list("status", flat=True)) == [LedgerStatus.DONE]


# --- ticket expiry --------------------------------------------------------------------------------


def test_reaper_expires_an_undecided_ticket_and_its_run():
    """A pending ticket past its expiry: ticket and run expired, audited, and no longer decidable."""
    tenant, requester, approver = _people()
    run = paused_run(tenant, requested_by=requester)
    ticket = Ticket.objects.get(run=run)
    Ticket.objects.filter(pk=ticket.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    report = reap()

    assert report.expired_runs == [run.pk]
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.EXPIRED
    run.refresh_from_db()
    assert run.status == RunStatus.EXPIRED
    assert run.status_reason == "a ticket expired before anyone decided it"
    assert _actions(run)[-2:] == ["ticket.expired", "run.expired"]
    with pytest.raises(TicketExpiredError):
        decide(Ticket.objects.get(pk=ticket.pk), user=approver, approve=True)
    assert reap().expired_runs == []
    assert _actions(run).count("ticket.expired") == 1
    assert _resume_tasks().count() == 0
    assert demo.read_effects() == []
