"""Notifications: webhook endpoints, their deliveries, and email.

Each service owns its transaction and lists its side effects. The fan-out runs when an audit
event has committed (approvals.signals.audit_event_committed); it only writes delivery rows and
enqueues tasks, so a slow receiver or SMTP server never slows a decision.

Payloads carry ids, the tool name, the arguments digest, the status, the actor and a link, but
never argument values: arguments are stored as the model sent them (only the audit log and the
pages mask secret-shaped values), so they may hold secrets or customer data. A receiver that
needs them follows the link and signs in.

approvals' commands (worker, rotate_keys, seed_demo) and webhook_receiver, which
this branch may not edit, still import a few names from here: those are imported
`as` themselves, which keeps them exported.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import smtplib
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage, get_connection
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from approvals import audit, crypto, live
from approvals.models import DECIDING_ROLES, ApproverGroup, AuditEvent, Membership
from notifications import signing, transport
from notifications.attempts import claim, reopen, settle, short_error, still_claimed, wake_worker
from notifications.endpoints import audited_host, endpoint_secret
from notifications.endpoints import create_endpoint as create_endpoint
from notifications.endpoints import rotate_webhook_secrets as rotate_webhook_secrets
from notifications.events import Facts, event_for, facts_for
from notifications.models import (
    Delivery,
    DeliveryStatus,
    EmailDelivery,
    Event,
    WebhookEndpoint,
)
from notifications.targets import WebhookURLError as WebhookURLError

USER_AGENT = "approval-console-webhooks/1"


# --- fan-out --------------------------------------------------------------------------------


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


def recipients_for(facts: Facts, tenant_id: int) -> list[str]:
    """Who gets an email: the one rule, to extend here.

    New ticket: the tenant's deciding members (not the requester, who may not approve).
    Escalation: the deciding members of the group it went to (all deciding members when the
    group is gone). Anything else: the person who started the run. Never the person who caused
    the event.
    """
    if facts.event == Event.TICKET_ESCALATED and facts.group:
        ids = _deciding_member_ids(tenant_id) - {facts.requester_id}
        group = ApproverGroup.objects.filter(tenant_id=tenant_id, name=facts.group).first()
        if group is not None:
            ids &= set(group.members.values_list("pk", flat=True))
    elif facts.event in (Event.TICKET_CREATED, Event.TICKET_ESCALATED):
        ids = _deciding_member_ids(tenant_id) - {facts.requester_id}
    else:
        ids = {facts.requester_id}
    return _emails(ids - {None, facts.actor_id})


def fan_out(*, audit_event: AuditEvent) -> list[Delivery]:
    """Turn a committed audit event into deliveries and emails.

    Side effects: one Delivery row per active endpoint of the tenant that wants the event
    (idempotent per endpoint and event) with its delivery task enqueued; one EmailDelivery row
    per recipient (idempotent per recipient and event), its message rendered now, with its
    email task enqueued. Nothing at all for an audit action that does not notify.
    """
    event = event_for(audit_event)
    if event is None:
        return []
    # Filtered here, not in SQL: JSON containment differs between SQLite and PostgreSQL.
    active = WebhookEndpoint.objects.filter(tenant_id=audit_event.tenant_id, active=True)
    endpoints = [e for e in active if e.wants(event)]
    facts = facts_for(audit_event, event)
    recipients = recipients_for(facts, audit_event.tenant_id)
    if not endpoints and not recipients:
        return []
    from notifications.tasks import deliver_webhook_task

    body = json.dumps(facts.payload(audit_event), separators=(",", ":"), sort_keys=True)
    now = timezone.now()
    created = []
    with transaction.atomic():
        for endpoint in endpoints:
            delivery, new = Delivery.objects.get_or_create(
                endpoint=endpoint,
                audit_event_id=audit_event.pk,
                defaults={
                    "tenant_id": endpoint.tenant_id,
                    "event": event,
                    "payload": body,
                    "next_attempt_at": now,
                    "created_at": now,
                    "updated_at": now,
                },
            )
            if new:
                deliver_webhook_task.enqueue(delivery.pk)
                created.append(delivery)
        if recipients:
            subject, text = email_for(facts)
            _create_emails(audit_event, event, subject, text, recipients, now)
        if created or recipients:
            live.notify_admins_on_commit(audit_event.tenant_id, status=DeliveryStatus.PENDING)
        wake_worker()
    return created


# --- delivering -----------------------------------------------------------------------------


def attempt(delivery_id: int, *, now: datetime | None = None) -> Delivery | None:
    """Send one attempt of a pending delivery whose time has come; None when there was none.

    Side effects: claims the attempt (attempts + 1) in a short transaction, POSTs outside any
    transaction, then records the outcome: delivered (audit webhook.delivered); or, after
    MAX_ATTEMPTS, failed (audit webhook.failed); or pending with the next attempt enqueued
    after the backoff.
    """
    now = now or timezone.now()
    delivery = claim(Delivery.objects.select_related("endpoint"), delivery_id, now)
    if delivery is None:
        return None
    endpoint = delivery.endpoint
    body = delivery.payload.encode()
    try:
        secret = endpoint_secret(endpoint)
    except crypto.CryptoError:
        outcome = transport.Outcome(
            False, None, "the signing secret cannot be opened with the key ring", 0
        )
    else:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-Approvals-Event": delivery.event,
            "X-Approvals-Delivery": str(delivery.pk),
            # The wall clock, not `now`: the receiver checks when the request was really sent.
            **signing.headers(secret, body),
        }
        outcome = transport.post(endpoint.url, body, headers)
    return _record(delivery, outcome, now)


def _record(delivery: Delivery, outcome: transport.Outcome, now: datetime) -> Delivery:
    from notifications.tasks import deliver_webhook_task

    with transaction.atomic():
        if not still_claimed(Delivery.objects, delivery):
            # Overtaken by a newer attempt, or its endpoint was deleted meanwhile.
            return Delivery.objects.filter(pk=delivery.pk).first() or delivery
        delivery.last_status_code = outcome.status_code
        delivery.last_error = outcome.error
        delivery.last_duration_ms = outcome.duration_ms
        final = settle(delivery, ok=outcome.ok, now=now)
        action = "webhook.delivered" if outcome.ok else "webhook.failed" if final else ""
        delivery.save(
            update_fields=[
                "status",
                "attempts",
                "next_attempt_at",
                "last_status_code",
                "last_error",
                "last_duration_ms",
                "updated_at",
                "delivered_at",
            ]
        )
        if action:
            _audit_delivery(delivery, action, actor=None)
        else:
            deliver_webhook_task.using(run_after=delivery.next_attempt_at).enqueue(delivery.pk)
        live.notify_admins_on_commit(
            delivery.tenant_id, delivery=delivery.pk, status=delivery.status
        )
    return delivery


def _audit_delivery(delivery: Delivery, action: str, *, actor) -> None:
    audit.append(
        tenant_id=delivery.tenant_id,
        action=action,
        actor=actor,
        actor_name="" if actor else "notifications",
        outcome=delivery.status,
        detail={
            "delivery": delivery.pk,
            "endpoint": delivery.endpoint_id,
            "event": delivery.event,
            "audit_event": delivery.audit_event_id,
            "attempts": delivery.attempts,
            "status_code": delivery.last_status_code,
            "error": delivery.last_error,
        },
    )


# A pending delivery this far past its time has lost its task (a worker died mid-attempt).
STALE = timedelta(minutes=2)


def requeue_stale(*, now: datetime | None = None) -> int:
    """Give lost webhook and email deliveries a task again; called by the worker's reaper loop.

    Side effects: each pending Delivery and EmailDelivery whose next attempt is more than STALE
    overdue (up to 500 of each a pass) gets its task enqueued and its next attempt set to now
    (so the next pass leaves it alone). A duplicate task is harmless: the claim lets one
    attempt through.
    """
    from notifications.tasks import deliver_email_task, deliver_webhook_task

    now = now or timezone.now()
    found = 0
    with transaction.atomic():
        for model, task in ((Delivery, deliver_webhook_task), (EmailDelivery, deliver_email_task)):
            stale = list(
                model.objects.select_for_update()
                .filter(status=DeliveryStatus.PENDING, next_attempt_at__lt=now - STALE)
                .values_list("pk", flat=True)[:500]
            )
            if not stale:
                continue
            model.objects.filter(pk__in=stale).update(next_attempt_at=now, updated_at=now)
            for pk in stale:
                task.enqueue(pk)
            found += len(stale)
        if found:
            wake_worker()
    return found


def retry(delivery: Delivery, *, user) -> Delivery:
    """Send a failed delivery again from its first attempt.

    Side effects: the delivery goes back to pending with attempts 0 (compare-and-set on
    failed, so two clicks retry once); audit webhook.retried; its task enqueued.
    """
    from notifications.tasks import deliver_webhook_task

    with transaction.atomic():
        reopen(Delivery.objects, delivery.pk, "delivery")
        delivery.refresh_from_db()
        _audit_delivery(delivery, "webhook.retried", actor=user)
        deliver_webhook_task.enqueue(delivery.pk)
        live.notify_admins_on_commit(
            delivery.tenant_id, delivery=delivery.pk, status=delivery.status
        )
        wake_worker()
    return delivery


# --- test ping -------------------------------------------------------------------------------

PING_EVENT = "ping"


def ping(endpoint: WebhookEndpoint, *, user) -> transport.Outcome:
    """Send one signed test event to an endpoint now and return what it answered.

    The body has the shape of a real delivery with event "ping" and no ticket or run, so a
    receiver can check its signature handling end to end; an inactive endpoint can be tested
    before it is switched on. Not retried and not in the delivery log: the answer is shown to
    the admin who asked.

    Side effects: one POST (outside any transaction, bounded by transport.TIMEOUT_SECONDS);
    audit webhook.pinged with the outcome (delivered or failed), the status code and the error.
    """
    tenant = endpoint.tenant
    sent_at = timezone.now()
    payload = {
        "id": f"{tenant.slug}:ping:{secrets.token_hex(8)}",
        "event": PING_EVENT,
        "action": "webhook.pinged",
        "tenant": tenant.slug,
        "webhook": endpoint.pk,
        "ticket": None,
        "run": None,
        "actor": user.get_username(),
        "time": sent_at.isoformat(),
        "url": settings.APPROVALS_PUBLIC_URL.rstrip("/")
        + reverse("notifications:webhook", args=[tenant.slug, endpoint.pk]),
    }
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    try:
        secret = endpoint_secret(endpoint)
    except crypto.CryptoError:
        outcome = transport.Outcome(
            False, None, "the signing secret cannot be opened with the key ring", 0
        )
    else:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-Approvals-Event": PING_EVENT,
            "X-Approvals-Delivery": "ping",
            **signing.headers(secret, body),
        }
        outcome = transport.post(endpoint.url, body, headers)
    with transaction.atomic():
        audit.append(
            tenant_id=endpoint.tenant_id,
            action="webhook.pinged",
            actor=user,
            outcome=DeliveryStatus.DELIVERED if outcome.ok else DeliveryStatus.FAILED,
            detail={
                "endpoint": endpoint.pk,
                "host": audited_host(endpoint.url),
                "status_code": outcome.status_code,
                "error": outcome.error,
                "duration_ms": outcome.duration_ms,
            },
        )
    return outcome


# --- email ----------------------------------------------------------------------------------

SUBJECTS = {
    Event.TICKET_CREATED: "Approval needed: {tool}",
    Event.TICKET_DECIDED: "{tool} {status} by {actor}",
    Event.TICKET_EXPIRED: "{tool} expired without a decision",
    Event.TICKET_ESCALATED: "Escalated: {tool} needs a decision",
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


def _create_emails(
    audit_event: AuditEvent,
    event: str,
    subject: str,
    body: str,
    recipients: list[str],
    now: datetime,
) -> list[EmailDelivery]:
    """One EmailDelivery per new recipient, in one insert, and one task that sends them all
    over one SMTP connection; the caller's transaction."""
    from notifications.tasks import deliver_emails_task

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
        created = _create_emails(audit_event, event, subject, body, recipients, timezone.now())
        wake_worker()
    return len(created)


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
    from notifications.tasks import deliver_email_task

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
        live.notify_admins_on_commit(email.tenant_id, email=email.pk, status=email.status)
    return email


def _audit_email(email: EmailDelivery, action: str, *, actor) -> None:
    # The address is personal data and the audit log is append-only: it keeps the row's id
    # (the row, which goes with its tenant, has the address) and a masked form only.
    audit.append(
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
    from notifications.tasks import deliver_email_task

    with transaction.atomic():
        reopen(EmailDelivery.objects, email.pk, "email")
        email.refresh_from_db()
        _audit_email(email, "email.retried", actor=user)
        deliver_email_task.enqueue(email.pk)
        live.notify_admins_on_commit(email.tenant_id, email=email.pk, status=email.status)
        wake_worker()
    return email
