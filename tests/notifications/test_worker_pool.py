"""`manage.py worker` runs notifications in their own pool: a receiver or an SMTP server that never
answers holds up no resume, and the fan-out happens in the worker, not where events commit."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django_tasks_db.compat import TaskResultStatus
from django_tasks_db.models import DBTaskResult

from approvals.decisions.decide import decide
from approvals.execution.queue import SIDE_QUEUE, resume_run_task
from approvals.models import Role, Run, RunStatus, Ticket, WorkerHeartbeat
from devtools import demo
from devtools.bench.silent import SilentReceiver
from notifications.models import Delivery, EmailDelivery
from tests.conftest import subprocess_env
from tests.notifications.conftest import fan_out_committed, make_endpoint
from tests.support import TenantFactory, member, paused_run, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def silent():
    """A TCP server on loopback that accepts every connection and never sends a byte."""
    server = SilentReceiver()
    yield server
    server.close()


def with_email(user, address: str):
    user.email = address
    user.save(update_fields=["email"])
    return user


def test_worker_resumes_while_its_notifications_hang_on_a_silent_server(manage_process, silent):
    tenant = TenantFactory(slug="acme")
    admin = member(tenant, Role.ADMIN, username="boss")
    make_endpoint(tenant, admin, url=f"http://127.0.0.1:{silent.port}/hook")
    requester = with_email(member(tenant, Role.VIEWER, username="req"), "req@example.com")
    approver = with_email(member(tenant, Role.APPROVER, username="ann"), "ann@example.com")
    run = paused_run(tenant, requested_by=requester)
    # The new ticket's webhook and email tasks are queued first (as a worker's pass does) ...
    fan_out_committed()
    notifications = DBTaskResult.objects.filter(queue_name=SIDE_QUEUE)
    assert notifications.count() == 2
    # ... and the resume's task after them.
    decide(Ticket.objects.get(run=run), user=approver, approve=True)
    resume = DBTaskResult.objects.get(task_path=resume_run_task.module_path)
    assert resume.enqueued_at > max(notifications.values_list("enqueued_at", flat=True))
    # A worker that stopped long ago left a task row RUNNING: this worker's reaper settles it.
    abandoned = DBTaskResult.objects.get(pk=resume_run_task.enqueue(run.pk).id)
    abandoned.claim("gone-worker")
    WorkerHeartbeat.objects.create(
        worker_id="gone-worker", last_seen=timezone.now() - timedelta(hours=1)
    )

    manage_process(
        "worker",
        "--worker-id",
        "w1",
        env=subprocess_env(
            APPROVALS_REAPER_INTERVAL_SECONDS="1",
            EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
            EMAIL_HOST="127.0.0.1",
            EMAIL_PORT=str(silent.port),
            # The SMTP client waits for a greeting that never comes for a minute.
            EMAIL_TIMEOUT="60",
        ),
    )
    wait_until(lambda: silent.connections, timeout=60, what="a delivery to reach the silent server")
    wait_until(
        lambda: Run.objects.filter(pk=run.pk, status=RunStatus.COMPLETED).exists(),
        timeout=60,
        what="the run to be resumed and completed",
    )

    # The resume is done while a notification is still waiting on the silent server.
    hanging = DBTaskResult.objects.filter(queue_name=SIDE_QUEUE, status=TaskResultStatus.RUNNING)
    assert [row.worker_ids for row in hanging] == [["w1/notifications-1"]]
    assert DBTaskResult.objects.get(pk=resume.pk).status == TaskResultStatus.SUCCESSFUL
    assert DBTaskResult.objects.get(pk=resume.pk).worker_ids == ["w1"]
    assert len(demo.read_effects("deploy_release")) == 1
    # The worker's pool fanned out what the decision and the resume committed.
    wait_until(
        lambda: Delivery.objects.filter(audit_event__action="run.completed").exists(),
        timeout=30,
        what="the worker to fan out the run's completion",
    )
    assert EmailDelivery.objects.filter(recipient="req@example.com", event="run.completed").exists()
    # And its reaper settled the row the stopped worker had left RUNNING.
    settled = wait_until(
        lambda: DBTaskResult.objects.filter(
            pk=abandoned.pk, status=TaskResultStatus.FAILED
        ).first(),
        timeout=30,
        what="the reaper to settle the stopped worker's task row",
    )
    assert settled.traceback.startswith("worker gone-worker stopped (last seen ")
    assert WorkerHeartbeat.objects.filter(worker_id="w1/notifications-1").exists()
