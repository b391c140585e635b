"""Notification email through Django's email backend (locmem here), sent by the task queue."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.db import transaction
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals import audit, services
from approvals.models import ApproverGroup, Role, Ticket
from notifications.tasks import send_email_task
from tests.factories import member, paused_run

pytestmark = pytest.mark.django_db

EMAIL_TASK = "notifications.tasks.send_email_task"


@pytest.fixture(autouse=True)
def _locmem(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.APPROVALS_PUBLIC_URL = "https://approvals.example.com"


def with_email(user, address: str):
    user.email = address
    user.save(update_fields=["email"])
    return user


def run_email_tasks() -> None:
    """What the worker does: run each queued email task once."""
    for row in DBTaskResult.objects.filter(task_path=EMAIL_TASK).order_by("enqueued_at"):
        send_email_task.call(*row.args_kwargs["args"], **row.args_kwargs["kwargs"])
        row.delete()


@pytest.fixture
def people(tenant):
    return {
        "requester": with_email(member(tenant, Role.VIEWER, "req"), "req@example.com"),
        "approver": with_email(member(tenant, Role.APPROVER, "ann"), "ann@example.com"),
        "approver2": with_email(member(tenant, Role.APPROVER, "bob"), "bob@example.com"),
        "admin": with_email(member(tenant, Role.ADMIN, "ada"), "ada@example.com"),
        "viewer": with_email(member(tenant, Role.VIEWER, "vic"), "vic@example.com"),
        "no_email": member(tenant, Role.APPROVER, "noemail"),
    }


def test_email_new_ticket_goes_to_deciding_members_with_a_link_to_the_ticket(
    tenant, people, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        run = paused_run(tenant, requested_by=people["requester"])
    ticket = Ticket.objects.get(run=run)

    assert mail.outbox == []  # nothing is sent before the worker runs the task
    run_email_tasks()

    assert sorted(m.to[0] for m in mail.outbox) == [
        "ada@example.com",
        "ann@example.com",
        "bob@example.com",
    ]
    assert all(len(m.to) == 1 for m in mail.outbox)
    message = mail.outbox[0]
    assert message.subject == "[Acme Corp] Approval needed: deploy_release"
    assert f"https://approvals.example.com/tickets/{ticket.pk}/" in message.body
    assert "Tool:    deploy_release" in message.body
    assert f"Run:     {run.title} (run {run.pk})" in message.body
    assert "Status:  pending" in message.body
    assert message.from_email == "approvals@localhost"


def test_email_decision_goes_to_the_requester_not_the_decider(
    tenant, people, django_capture_on_commit_callbacks
):
    run = paused_run(tenant, requested_by=people["requester"])
    ticket = Ticket.objects.get(run=run)

    with django_capture_on_commit_callbacks(execute=True):
        services.decide(ticket, user=people["approver"], approve=False, message="not today")
    run_email_tasks()

    assert [m.to for m in mail.outbox] == [["req@example.com"]]
    message = mail.outbox[0]
    assert message.subject == "[Acme Corp] deploy_release rejected by ann"
    assert f"https://approvals.example.com/tickets/{ticket.pk}/" in message.body
    assert "Status:  rejected" in message.body
    assert "By:      ann" in message.body


def test_email_expiry_reaches_the_requester_for_ticket_and_run(
    tenant, people, django_capture_on_commit_callbacks
):
    run = paused_run(tenant, requested_by=people["requester"])
    Ticket.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))

    with django_capture_on_commit_callbacks(execute=True):
        services.reap()
    run_email_tasks()

    assert [(m.to, m.subject) for m in mail.outbox] == [
        (["req@example.com"], "[Acme Corp] deploy_release expired without a decision"),
        (["req@example.com"], f"[Acme Corp] Run expired: {run.title}"),
    ]
    assert f"https://approvals.example.com/runs/{run.pk}/" in mail.outbox[1].body


def test_email_escalation_goes_to_deciding_members(
    tenant, people, django_capture_on_commit_callbacks
):
    run = paused_run(tenant, requested_by=people["requester"])
    ticket = Ticket.objects.get(run=run)

    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        audit.append(
            tenant_id=tenant.pk,
            action="ticket.escalated",
            actor_name="policy",
            run_id=run.pk,
            ticket_id=ticket.pk,
            tool_name=ticket.tool_name,
            outcome="pending",
        )
    run_email_tasks()

    assert sorted(m.to[0] for m in mail.outbox) == [
        "ada@example.com",
        "ann@example.com",
        "bob@example.com",
    ]
    assert mail.outbox[0].subject == "[Acme Corp] Escalated: deploy_release needs a decision"


def test_email_escalation_to_a_group_goes_to_its_deciding_members_only(
    tenant, people, django_capture_on_commit_callbacks
):
    run = paused_run(tenant, requested_by=people["requester"])
    ticket = Ticket.objects.get(run=run)
    group = ApproverGroup.objects.create(tenant=tenant, name="security reviewers")
    group.members.add(User.objects.get(email="bob@example.com"))

    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        audit.append(
            tenant_id=tenant.pk,
            action="ticket.escalated",
            actor_name="reaper",
            run_id=run.pk,
            ticket_id=ticket.pk,
            tool_name=ticket.tool_name,
            outcome="pending",
            detail={"group": "security reviewers"},
        )
    run_email_tasks()

    assert [m.to for m in mail.outbox] == [["bob@example.com"]]


def test_email_never_carries_argument_values(tenant, people, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        run = paused_run(
            tenant, requested_by=people["requester"], prompt="Deploy release 2026.07.24 to prod"
        )
    run_email_tasks()

    ticket = Ticket.objects.get(run=run)
    body = mail.outbox[0].body.replace(run.title, "")
    assert '"release"' not in body and "2026.07.24" not in body
    assert ticket.arguments_digest in body
