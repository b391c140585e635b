"""Email: who gets one, what it says, and sending it with retries.

The fan-out renders an event's message once (email_for) for each recipient (recipients_for),
writes one EmailDelivery row per recipient and enqueues one task that sends them all over one
SMTP connection (attempt_emails); a retry is one task per row. Every attempt sends the same
message, and no email holds argument values.
"""

from __future__ import annotations

import contextlib
import re
import smtplib
from datetime import datetime

from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage, get_connection
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.utils import timezone
from django_tasks import task

from approvals.audit import chain
from approvals.live import hints
from approvals.models import DECIDING_ROLES, ApproverGroup, AuditEvent, Membership
from notifications.attempts import (
    QUEUE,
    claim,
    reopen,
    report,
    settle,
    short_error,
    still_claimed,
)
from notifications.events import Facts, event_for, facts_for
from notifications.models import DeliveryStatus, EmailDelivery, Event

# --- what it says ---------------------------------------------------------------------------


SUBJECTS = {
    Event.TICKET_CREATED: "Approval needed: {tool}",
    Event.TICKET_DECIDED: "{tool} {status} by {actor}",
    Event.TICKET_EXPIRED: "{tool} expired without a decision",
    Event.TICKET_ESCALATED: "Escalated: {tool} needs a decision",
    Event.RUN_DECIDED: "Decided, waiting for its caller: {title}",
    Event.RUN_COMPLETED: "Run completed: {title}",
    Event.RUN_FAILED: "Run {status}: {title}",
}


def email_for(facts: Facts) -> tuple[str, str]:
    """Subject and plain-text body of a notification email."""
    subject = SUBJECTS[facts.event].format(
        tool=facts.tool or "a tool call",
        status=facts.status.replace("_", " ") or "changed",
        actor=facts.actor,
        title=facts.run_title or f"run {facts.run_id}",
    )
    subject = f"[{facts.tenant_name}] {subject}"[:200]
    body = render_to_string("notifications/email.txt", {"facts": facts})
    return subject, body


# --- who gets it ----------------------------------------------------------------------------


class Addressees:
    """What recipients_for reads about people, read once for a pass of the fan-out: the events
    of a pass name the same few people again and again (every run of a requester, every ticket
    of a tenant's deciders). Each answer as it was when first asked for in the pass, as the
    pass's endpoints are (fan_out.active_endpoints)."""

    def __init__(self) -> None:
        self._emails: dict[frozenset, list[str]] = {}
        self._deciders: dict[int, frozenset[int]] = {}

    def emails(self, user_ids) -> list[str]:
        """The addresses of those of the users who are active and have one, sorted."""
        key = frozenset(user_ids)
        if key not in self._emails:
            self._emails[key] = _emails(key)
        return self._emails[key]

    def deciding_member_ids(self, tenant_id: int) -> set[int]:
        if tenant_id not in self._deciders:
            self._deciders[tenant_id] = frozenset(_deciding_member_ids(tenant_id))
        return set(self._deciders[tenant_id])


def recipients_for(
    facts: Facts, tenant_id: int, *, addressees: Addressees | None = None
) -> list[str]:
    """Who gets an email: the one rule, to extend here.

    New ticket: the tenant's deciding members (not the requester, who may not approve).
    Escalation: the deciding members of the group it went to (all deciding members when the
    group is gone). Anything else: the person who started the run. Never the person who caused
    the event. addressees: a pass's Addressees, so that its events read each person once.
    """
    people = addressees or Addressees()
    if facts.event == Event.TICKET_ESCALATED and facts.group:
        ids = people.deciding_member_ids(tenant_id) - {facts.requester_id}
        group = ApproverGroup.objects.filter(tenant_id=tenant_id, name=facts.group).first()
        if group is not None:
            ids &= set(group.members.values_list("pk", flat=True))
    elif facts.event in (Event.TICKET_CREATED, Event.TICKET_ESCALATED):
        ids = people.deciding_member_ids(tenant_id) - {facts.requester_id}
    else:
        ids = {facts.requester_id}
    return people.emails(ids - {None, facts.actor_id})


def _emails(user_ids) -> list[str]:
    return sorted(
        set(
            get_user_model()
            .objects.filter(pk__in=list(user_ids), is_active=True)
            .exclude(email="")
            .values_list("email", flat=True)
        )
    )


def _deciding_member_ids(tenant_id: int) -> set[int]:
    return set(
        Membership.objects.filter(tenant_id=tenant_id, role__in=DECIDING_ROLES).values_list(
            "user_id", flat=True
        )
    )


# --- rows and tasks -------------------------------------------------------------------------


def create_emails(
    audit_event: AuditEvent,
    event: str,
    subject: str,
    body: str,
    recipients: list[str],
    now: datetime,
) -> list[EmailDelivery]:
    """One EmailDelivery per new recipient, in one insert, and one task that sends them all
    over one SMTP connection; the caller's transaction."""
    known = set(
        EmailDelivery.objects.filter(
            audit_event_id=audit_event.pk, recipient__in=recipients
        ).values_list("recipient", flat=True)
    )
    rows = [
        EmailDelivery(
            audit_event_id=audit_event.pk,
            recipient=recipient,
            tenant_id=audit_event.tenant_id,
            event=event,
            subject=subject,
            body=body,
            next_attempt_at=now,
            created_at=now,
            updated_at=now,
        )
        for recipient in dict.fromkeys(recipients)
        if recipient not in known
    ]
    if not rows:
        return []
    try:
        with transaction.atomic():
            created = EmailDelivery.objects.bulk_create(rows)
    except IntegrityError:
        return []  # another fan-out of the same event wrote them first, with their task
    deliver_emails_task.enqueue([email.pk for email in created])
    return created


def send_email(*, audit_event_id: int, recipients: list[str]) -> int:
    """Record the emails of a task queued before each email had its own row (upgrades only).

    Side effects: one EmailDelivery row per recipient without one, with its task enqueued,
    exactly as fan_out writes them. Returns how many rows were new; nothing is sent here.
    """
    audit_event = AuditEvent.objects.get(pk=audit_event_id)
    event = event_for(audit_event)
    if event is None or not recipients:
        return 0
    subject, body = email_for(facts_for(audit_event, event))
    with transaction.atomic():
        created = create_emails(audit_event, event, subject, body, recipients, timezone.now())
    return len(created)


# --- addresses and errors -------------------------------------------------------------------


_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


def mask_address(address: str) -> str:
    """a***@example.com: tells mailboxes apart in the audit log without keeping the address."""
    local, _, domain = address.rpartition("@")
    return f"{local[:1]}***@{domain}" if local and domain else "***"


def _smtp_text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _email_error(error: Exception) -> str:
    if isinstance(error, smtplib.SMTPRecipientsRefused):
        # One recipient per message: the reply for it, without the dict around it.
        text = "; ".join(
            f"refused: {code} {_smtp_text(reply)}" for code, reply in error.recipients.values()
        )
    elif isinstance(error, smtplib.SMTPResponseException):
        text = f"SMTP {error.smtp_code}: {_smtp_text(error.smtp_error)}"
    else:
        text = f"{type(error).__name__}: {error}"
    # SMTP replies often quote the address; the row names the recipient, the error need not.
    return short_error(_ADDRESS.sub(lambda match: mask_address(match.group()), text))


# --- sending --------------------------------------------------------------------------------


@task(queue_name=QUEUE)
def deliver_email_task(email_id: int) -> dict[str, int]:
    return report("email", [attempt_email(email_id)])


@task(queue_name=QUEUE)
def deliver_emails_task(email_ids: list[int]) -> dict[str, int]:
    """The emails of one event, sent over one SMTP connection; retries go one by one."""
    sent = attempt_emails(email_ids)
    return report("email", sent, skipped=len(email_ids) - len(sent))


def attempt_email(email_id: int, *, now: datetime | None = None) -> EmailDelivery | None:
    """attempt_emails for one email; None when it had no attempt due."""
    sent = attempt_emails([email_id], now=now)
    return sent[0] if sent else None


def attempt_emails(email_ids: list[int], *, now: datetime | None = None) -> list[EmailDelivery]:
    """Send one attempt of each pending email whose time has come, over one SMTP connection.

    Side effects: claims each attempt (attempts + 1) in a short transaction, hands the
    messages to EMAIL_BACKEND outside any transaction, then records each outcome on its own:
    delivered (not audited: one row per recipient would flood the log, and the row keeps
    delivered_at); or, after MAX_ATTEMPTS, failed (audit email.failed); or pending with its
    next attempt enqueued after the backoff. A connection that cannot be opened fails every
    claimed email's attempt with that error.
    """
    now = now or timezone.now()
    claimed = [e for e in (claim(EmailDelivery.objects, pk, now) for pk in email_ids) if e]
    if not claimed:
        return []
    smtp = get_connection(fail_silently=False)
    try:
        smtp.open()
    except Exception as error:
        text = _email_error(error)
        return [_record_email(email, text, now) for email in claimed]
    try:
        return [_record_email(email, _send_one(smtp, email), now) for email in claimed]
    finally:
        # A failed QUIT changes nothing that was sent.
        with contextlib.suppress(Exception):
            smtp.close()


def _send_one(smtp, email: EmailDelivery) -> str:
    """The error of sending one message ("" when the backend took it)."""
    message = EmailMessage(email.subject, email.body, None, [email.recipient], connection=smtp)
    try:
        message.send(fail_silently=False)
    except Exception as error:
        # Whatever the backend raises (SMTP refusals, a socket error, a bad header), the
        # attempt failed and is recorded; the task itself does not fail.
        return _email_error(error)
    return ""


def _record_email(email: EmailDelivery, error: str, now: datetime) -> EmailDelivery:
    with transaction.atomic():
        if not still_claimed(EmailDelivery.objects, email):
            # Overtaken by a newer attempt, or its tenant was deleted meanwhile.
            return EmailDelivery.objects.filter(pk=email.pk).first() or email
        email.last_error = error
        action = "email.failed" if settle(email, ok=not error, now=now) else ""
        email.save(
            update_fields=[
                "status",
                "attempts",
                "next_attempt_at",
                "last_error",
                "updated_at",
                "delivered_at",
            ]
        )
        if action:
            _audit_email(email, action, actor=None)
        elif email.status == DeliveryStatus.PENDING:
            deliver_email_task.using(run_after=email.next_attempt_at).enqueue(email.pk)
        hints.notify_admins_on_commit(email.tenant_id, email=email.pk, status=email.status)
    return email


def _audit_email(email: EmailDelivery, action: str, *, actor) -> None:
    # The address is personal data and the audit log is append-only: it keeps the row's id
    # (the row, which goes with its tenant, has the address) and a masked form only.
    chain.append(
        tenant_id=email.tenant_id,
        action=action,
        actor=actor,
        actor_name="" if actor else "notifications",
        outcome=email.status,
        detail={
            "delivery": email.pk,
            "recipient": mask_address(email.recipient),
            "event": email.event,
            "audit_event": email.audit_event_id,
            "attempts": email.attempts,
            "error": email.last_error,
        },
    )


def retry_email(email: EmailDelivery, *, user) -> EmailDelivery:
    """Send a failed email again from its first attempt, the same message as before.

    Side effects: the email goes back to pending with attempts 0 (compare-and-set on failed,
    so two clicks retry once); audit email.retried; its task enqueued.
    """
    with transaction.atomic():
        reopen(EmailDelivery.objects, email.pk, "email")
        email.refresh_from_db()
        _audit_email(email, "email.retried", actor=user)
        deliver_email_task.enqueue(email.pk)
        hints.notify_admins_on_commit(email.tenant_id, email=email.pk, status=email.status)
    return email
