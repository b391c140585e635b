"""Notification email through Django's email backend (locmem here): one recorded row per
recipient, sent by the task queue, retried with backoff."""

from __future__ import annotations

import smtplib
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.mail import EmailMessage
from django.db import transaction
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.audit import chain as audit
from approvals.decisions.decide import decide
from approvals.models import ApproverGroup, AuditEvent, Role, Ticket
from approvals.runs.reaper import reap
from notifications import attempts, deliveries, emails, fan_out
from notifications.emails import deliver_email_task, deliver_emails_task
from notifications.models import EmailDelivery
from notifications.tasks import send_email_task
from tests.notifications.conftest import caught_up, fan_out_committed
from tests.notifications.mail_backends import RefusingBackend
from tests.support import member, paused_run

pytestmark = pytest.mark.django_db

EMAIL_TASK = "notifications.emails.deliver_email_task"
# The emails of one event go out together; a retry goes alone.
BATCH_TASK = "notifications.emails.deliver_emails_task"


@pytest.fixture(autouse=True)
def _locmem(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.APPROVALS_PUBLIC_URL = "https://approvals.example.com"


def with_email(user, address: str):
    user.email = address
    user.save(update_fields=["email"])
    return user


def run_email_tasks() -> list[dict | str]:
    """What the worker does: fan out what committed, then run each queued email task once (in
    the order of their rows). Returns each task's result, or the message it failed with (the
    worker records it FAILED)."""
    fan_out_committed()
    tasks = {EMAIL_TASK: deliver_email_task, BATCH_TASK: deliver_emails_task}
    rows = DBTaskResult.objects.filter(task_path__in=tasks)
    results: list[dict | str] = []
    for row in sorted(rows, key=lambda r: str(r.args_kwargs["args"][0])):
        try:
            results.append(
                tasks[row.task_path].call(*row.args_kwargs["args"], **row.args_kwargs["kwargs"])
            )
        except attempts.DeliveryFailed as failed:
            results.append(str(failed))
        row.delete()
    return results


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
    caught_up(tenant)
    ticket = Ticket.objects.get(run=run)

    with django_capture_on_commit_callbacks(execute=True):
        decide(ticket, user=people["approver"], approve=False, message="not today")
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
    caught_up(tenant)
    Ticket.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))

    with django_capture_on_commit_callbacks(execute=True):
        reap()
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
    caught_up(tenant)
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
    caught_up(tenant)
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


# --- recorded, retried, failed ----------------------------------------------------------------


@pytest.fixture
def smtp(settings):
    """The refusing backend, reset: set `.down` or add addresses to `.refused`."""
    settings.EMAIL_BACKEND = "tests.notifications.mail_backends.RefusingBackend"
    RefusingBackend.refused = set()
    RefusingBackend.down = RefusingBackend.unreachable = False
    RefusingBackend.opened = 0
    yield RefusingBackend
    RefusingBackend.refused = set()
    RefusingBackend.down = RefusingBackend.unreachable = False


def escalate(tenant, people, detail=None):
    """A ticket.escalated event (to every deciding member unless a group is named), fanned out."""
    run = paused_run(tenant, requested_by=people["requester"])
    ticket = Ticket.objects.get(run=run)
    caught_up(tenant)
    with transaction.atomic():
        event = audit.append(
            tenant_id=tenant.pk,
            action="ticket.escalated",
            actor_name="policy",
            run_id=run.pk,
            ticket_id=ticket.pk,
            tool_name=ticket.tool_name,
            outcome="pending",
            detail=detail,
        )
    fan_out_committed()
    return event


def email_tasks() -> list[tuple[int, object]]:
    """(email id, run_after or None) of the queued email tasks, a batch's emails one by one."""
    tasks = (
        (pk, row.run_after if row.run_after.year < 9999 else None)
        for row in DBTaskResult.objects.filter(task_path__in=[EMAIL_TASK, BATCH_TASK])
        for arg in [row.args_kwargs["args"][0]]
        for pk in (arg if isinstance(arg, list) else [arg])
    )
    return sorted(tasks, key=lambda t: (t[0], t[1].isoformat() if t[1] else ""))


def test_email_fan_out_records_one_pending_row_per_recipient_with_the_message(tenant, people):
    event = escalate(tenant, people)

    rows = list(EmailDelivery.objects.filter(audit_event_id=event.pk).order_by("recipient"))
    assert [(r.recipient, r.status, r.attempts) for r in rows] == [
        ("ada@example.com", "pending", 0),
        ("ann@example.com", "pending", 0),
        ("bob@example.com", "pending", 0),
    ]
    assert {r.subject for r in rows} == {"[Acme Corp] Escalated: deploy_release needs a decision"}
    assert all(f"/tickets/{event.ticket_id}/" in r.body for r in rows)
    assert rows[0].link == f"https://approvals.example.com/tickets/{event.ticket_id}/"
    assert [pk for pk, _ in email_tasks()] == sorted(r.pk for r in rows)
    # Twice for one event: no new rows, no new tasks.
    fan_out.fan_out(audit_event=event)
    assert EmailDelivery.objects.filter(audit_event_id=event.pk).count() == 3
    assert len(email_tasks()) == 3

    run_email_tasks()

    rows = list(EmailDelivery.objects.filter(audit_event_id=event.pk))
    assert {(r.status, r.attempts, r.last_error) for r in rows} == {("delivered", 1, "")}
    assert all(r.delivered_at is not None and r.next_attempt_at is None for r in rows)
    assert len(mail.outbox) == 3
    # A delivered email is not audited (one row per recipient would flood the log).
    assert not AuditEvent.objects.filter(action__startswith="email.").exists()


def test_email_smtp_down_is_retried_with_backoff_then_failed_and_audited(tenant, people, smtp):
    smtp.down = True
    event = escalate(tenant, people, detail={"group": "security"})
    group = ApproverGroup.objects.create(tenant=tenant, name="security")
    group.members.add(people["approver2"])
    EmailDelivery.objects.all().delete()
    DBTaskResult.objects.all().delete()
    fan_out.fan_out(audit_event=event)
    email = EmailDelivery.objects.get()
    assert email.recipient == "bob@example.com"
    now = timezone.now()
    waits = []

    for attempt in range(1, attempts.MAX_ATTEMPTS + 1):
        if attempt > 1:
            # Too early: nothing is sent before the next attempt's time.
            assert emails.attempt_email(email.pk, now=now - timedelta(seconds=2)) is None
        email = emails.attempt_email(email.pk, now=now)
        assert email.attempts == attempt
        if attempt == 1:
            assert (email.status, email.next_attempt_at) == ("pending", now + timedelta(seconds=10))
            assert email.last_error == "ConnectionRefusedError: [Errno 111] Connection refused"
            assert email_tasks() == [(email.pk, None), (email.pk, now + timedelta(seconds=10))]
        if email.next_attempt_at:
            waits.append(email.next_attempt_at - now)
            now = email.next_attempt_at

    assert waits == attempts.BACKOFF
    assert (email.status, email.next_attempt_at) == ("failed", None)
    assert mail.outbox == []
    # One task per attempt: the fan-out's, then four scheduled after their backoff.
    assert len(email_tasks()) == attempts.MAX_ATTEMPTS
    failed = AuditEvent.objects.get(action="email.failed")
    assert (failed.outcome, failed.actor_name) == ("failed", "notifications")
    assert failed.detail == {
        "delivery": email.pk,
        "recipient": "b***@example.com",
        "event": "ticket.escalated",
        "audit_event": event.pk,
        "attempts": 5,
        "error": "ConnectionRefusedError: [Errno 111] Connection refused",
    }
    # The audit event notifies no one, and a failed email is never sent again by itself.
    assert EmailDelivery.objects.count() == 1
    assert emails.attempt_email(email.pk, now=now + timedelta(days=1)) is None
    smtp.down = False
    assert deliver_email_task.call(email.pk) == {"delivered": 0, "failed": 0, "skipped": 1}
    assert mail.outbox == []


def test_email_a_refused_recipient_is_retried_alone_with_the_same_message(tenant, people, smtp):
    smtp.refused.add("bob@example.com")
    event = escalate(tenant, people)

    run_email_tasks()

    rows = {r.recipient: r for r in EmailDelivery.objects.filter(audit_event_id=event.pk)}
    assert {to: (r.status, r.attempts) for to, r in rows.items()} == {
        "ada@example.com": ("delivered", 1),
        "ann@example.com": ("delivered", 1),
        "bob@example.com": ("pending", 1),
    }
    bob = rows["bob@example.com"]
    assert bob.last_error == "refused: 550 5.1.1 <b***@example.com>: mailbox unavailable"
    assert sorted(m.to[0] for m in mail.outbox) == ["ada@example.com", "ann@example.com"]
    # Only bob's email has a task left: the one scheduled after the first backoff.
    assert email_tasks() == [(bob.pk, bob.next_attempt_at)]

    smtp.refused.clear()
    emails.attempt_email(bob.pk, now=bob.next_attempt_at)

    bob.refresh_from_db()
    assert (bob.status, bob.attempts, bob.last_error) == ("delivered", 2, "")
    assert sorted(m.to[0] for m in mail.outbox) == [
        "ada@example.com",
        "ann@example.com",
        "bob@example.com",
    ]
    first, again = mail.outbox[0], mail.outbox[2]
    assert (again.subject, again.body) == (first.subject, first.body)
    assert again.subject == bob.subject and again.body == bob.body


def test_email_retry_puts_a_failed_email_back_once_and_audits(tenant, people, smtp):
    smtp.down = True
    escalate(tenant, people)
    email = EmailDelivery.objects.get(recipient="ann@example.com")
    EmailDelivery.objects.filter(pk=email.pk).update(status="failed", attempts=5)
    DBTaskResult.objects.all().delete()
    email.refresh_from_db()

    emails.retry_email(email, user=people["admin"])
    with pytest.raises(attempts.NotRetryable):
        emails.retry_email(email, user=people["admin"])

    email.refresh_from_db()
    assert (email.status, email.attempts) == ("pending", 0)
    assert email_tasks() == [(email.pk, None)]
    retried = AuditEvent.objects.get(action="email.retried")
    assert (retried.actor_id, retried.detail["delivery"]) == (people["admin"].pk, email.pk)
    assert retried.detail["recipient"] == "a***@example.com"
    assert "ann@example.com" not in str(retried.detail)

    smtp.down = False
    assert deliver_email_task.call(email.pk) == {"delivered": 1, "failed": 0, "skipped": 0}
    assert [m.to for m in mail.outbox] == [["ann@example.com"]]


def test_email_requeue_stale_gives_a_lost_email_its_task_once(tenant, people):
    escalate(tenant, people)
    lost = EmailDelivery.objects.get(recipient="ann@example.com")
    DBTaskResult.objects.all().delete()  # the worker died with the tasks
    now = timezone.now()
    EmailDelivery.objects.filter(pk=lost.pk).update(next_attempt_at=now - timedelta(minutes=3))

    assert deliveries.requeue_stale(now=now) == 1
    assert deliveries.requeue_stale(now=now + timedelta(seconds=10)) == 0

    assert [pk for pk, _ in email_tasks()] == [lost.pk]
    assert deliver_email_task.call(lost.pk) == {"delivered": 1, "failed": 0, "skipped": 0}
    assert [m.to for m in mail.outbox] == [["ann@example.com"]]


def test_email_task_queued_before_the_rows_existed_records_them(tenant, people):
    event = escalate(tenant, people)
    EmailDelivery.objects.filter(recipient="bob@example.com").delete()
    DBTaskResult.objects.all().delete()

    created = send_email_task.call(event.pk, ["ann@example.com", "bob@example.com"])

    assert created == 1
    assert [pk for pk, _ in email_tasks()] == [
        EmailDelivery.objects.get(recipient="bob@example.com").pk
    ]
    assert mail.outbox == []  # recorded and queued, not sent by this task


@pytest.mark.parametrize(
    ("error", "recorded"),
    [
        (
            smtplib.SMTPDataError(451, b"4.3.0 <ann@example.com> try again later"),
            "SMTP 451: 4.3.0 <a***@example.com> try again later",
        ),
        (smtplib.SMTPServerDisconnected("Connection unexpectedly closed"), None),
        (TimeoutError("timed out"), "TimeoutError: timed out"),
    ],
)
def test_email_any_backend_error_is_a_short_masked_failed_attempt(
    tenant, people, monkeypatch, error, recorded
):
    escalate(tenant, people)
    email = EmailDelivery.objects.get(recipient="ann@example.com")

    def broken(self, fail_silently=False):
        assert fail_silently is False
        raise error

    monkeypatch.setattr(EmailMessage, "send", broken)
    email = emails.attempt_email(email.pk)

    assert (email.status, email.attempts) == ("pending", 1)
    assert email.last_error == (
        recorded or "SMTPServerDisconnected: Connection unexpectedly closed"
    )
    assert "ann@example.com" not in email.last_error


def test_email_an_events_messages_go_out_over_one_connection(tenant, people, smtp):
    event = escalate(tenant, people)

    assert len(email_tasks()) == 3  # one task holding the three emails
    run_email_tasks()

    assert smtp.opened == 1
    assert sorted(m.to[0] for m in mail.outbox) == [
        "ada@example.com",
        "ann@example.com",
        "bob@example.com",
    ]
    statuses = EmailDelivery.objects.filter(audit_event_id=event.pk).values_list(
        "status", flat=True
    )
    assert set(statuses) == {"delivered"}


def test_email_an_unreachable_server_fails_each_claimed_attempt_once(tenant, people, smtp):
    event = escalate(tenant, people)
    smtp.unreachable = True

    results = run_email_tasks()

    # The task says so: it fails, rather than being recorded as a success.
    assert results == ["email deliveries: 0 delivered, 3 failed (3 to be retried)"]
    rows = EmailDelivery.objects.filter(audit_event_id=event.pk)
    assert [(r.status, r.attempts) for r in rows] == [("pending", 1)] * 3
    assert {r.last_error for r in rows} == {
        "ConnectionRefusedError: [Errno 111] Connection refused"
    }
    assert smtp.opened == 1 and mail.outbox == []
    assert len(email_tasks()) == 3  # each retried on its own after the backoff


def test_email_fan_out_queries_do_not_grow_with_recipients(tenant, people):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    # The test's transaction locks the tenant's row at its first audit append and holds it,
    # so both counted passes append as a worker's transaction holding it would.
    escalate(tenant, people)
    caught_up(tenant)  # the cursor exists for both passes, as it does for a worker
    counts = []
    for extra in (0, 10):
        for n in range(extra):
            with_email(member(tenant, Role.APPROVER, f"more{n}"), f"more{n}@example.com")
        with CaptureQueriesContext(connection) as queries:
            escalate(tenant, people)
        counts.append(len(queries))

    assert counts[0] == counts[1]


def test_email_a_stale_attempt_never_overwrites_a_newer_outcome(tenant, people, smtp):
    escalate(tenant, people)
    email = EmailDelivery.objects.get(recipient="ann@example.com")
    start = timezone.now()
    stale = attempts.claim(EmailDelivery.objects, email.pk, start)
    # The reaper gives the row a new task after IN_FLIGHT and STALE; that attempt delivers.
    later = start + attempts.IN_FLIGHT + deliveries.STALE + timedelta(seconds=1)
    assert emails.attempt_email(email.pk, now=later).status == "delivered"

    kept = emails._record_email(stale, "TimeoutError: timed out", start)

    email.refresh_from_db()
    assert (kept.status, email.status, email.attempts) == ("delivered", "delivered", 2)
    assert email.last_error == "" and email.delivered_at is not None
    assert len(mail.outbox) == 1
