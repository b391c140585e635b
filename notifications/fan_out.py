"""The fan-out: a committed audit event becomes webhook deliveries and emails.

It runs in the worker's notifications pool, never in the process that committed the event:
catch_up tails each tenant's audit chain from its cursor (approvals.signals.audit_tail, sent by
the pool's every poll, connected in receivers), so a decision, a pause or a resume pays nothing
for its notifications. It only writes delivery rows and enqueues their tasks on the
notifications queue; sending is the tasks' (deliveries, emails), so a slow receiver or SMTP
server holds up neither a decision nor a resume. A signed audit checkpoint goes out with its
statement when approvals.signals.audit_checkpointed says so (fan_out_checkpoint; sent by
`manage.py audit_checkpoint`, not on any request's path).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from django.db import DatabaseError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from approvals.core.links import public_url
from approvals.live import hints
from approvals.models import AuditEvent, Run, Tenant
from notifications.deliveries import deliver_webhook_task
from notifications.emails import Addressees, create_emails, email_for, recipients_for
from notifications.events import event_for, facts_for, in_full, runs_named
from notifications.models import Delivery, DeliveryStatus, Event, FanOutCursor, WebhookEndpoint

# Passes in a row an event's fan-out may fail before it is skipped (logged as an error), so one
# event that cannot be fanned out does not hold up its tenant's notifications for ever.
MAX_FAILURES = 5

logger = logging.getLogger("notifications")

# PostgreSQL's key of a tenant's fan-out lock: "FAN" in the high bytes, the tenant's id below.
_LOCK_SPACE = 0x46414E << 40


def catch_up(*, limit: int = 100) -> int:
    """Fan out the audit events committed since the last pass, each tenant's in seq order.

    A tenant's events are appended under its tenant-row lock, so they commit in seq order:
    every event after the cursor that this pass can see has committed, and none before it is
    still to come. A rolled-back event is never seen. Safe with several workers at once: the
    fan-out is idempotent per endpoint and event (emails per recipient and event), and the
    cursor only moves by compare-and-set from the seq this pass read, so a second pass over
    the same events fans out nothing twice and cannot move a cursor back. On PostgreSQL, one
    pass at a time fans a tenant out (_tenant_pass): another worker's pass passes the tenant by
    rather than do the same work again beside it. A pass that stops half-way (a crash, an
    error) leaves the cursor at the last event it fanned out.

    Side effects: fan_out's, for at most `limit` events of each tenant behind; creates a
    tenant's cursor at its first pass (from seq 0: the cursors of the tenants that existed
    before this fan-out were made at their chain's head by a migration) and moves it. An event
    whose fan-out raises is logged and tried again next pass; after MAX_FAILURES passes it is
    skipped with an error in the log. Returns how many events the cursors moved past.
    """
    behind = (
        Tenant.objects.filter(audit_seq__gt=0)
        .filter(Q(fan_out_cursor__isnull=True) | Q(audit_seq__gt=F("fan_out_cursor__seq")))
        .order_by("pk")
        .values_list("pk", "fan_out_cursor__seq", "fan_out_cursor__failures")
    )
    return sum(
        _catch_up_tenant(tenant_id, seq, failures, limit) for tenant_id, seq, failures in behind
    )


@contextmanager
def _tenant_pass(tenant_id: int) -> Iterator[bool]:
    """Whether this pass may fan the tenant out now.

    On PostgreSQL, a session advisory lock on the tenant, tried without waiting: False while
    another pass (another worker's pool) holds it, since that pass is fanning out these very
    events. The lock belongs to the connection, so a killed worker's goes with its connection.
    SQLite has one writer at a time and no such lock: every pass goes on, and the fan-out's
    idempotence and the cursor's compare-and-set keep it right.
    """
    if connection.vendor != "postgresql":
        yield True
        return
    key = _LOCK_SPACE + tenant_id
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        (held,) = cursor.fetchone()
    if not held:
        yield False
        return
    try:
        yield True
    finally:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
        except DatabaseError:
            # A lost connection took the lock with it. Inside a broken transaction (only when
            # a caller wraps the pass in one) the lock stays with the session: this connection
            # still fans the tenant out (the lock is re-entrant), other workers pass it by.
            logger.warning("fan-out lock of tenant %s not released", tenant_id, exc_info=True)


def _catch_up_tenant(tenant_id: int, seq: int | None, failures: int | None, limit: int) -> int:
    with _tenant_pass(tenant_id) as ours:
        return _fan_out_tenant(tenant_id, seq, failures, limit) if ours else 0


def _fan_out_tenant(tenant_id: int, seq: int | None, failures: int | None, limit: int) -> int:
    if seq is None:
        FanOutCursor.objects.get_or_create(tenant_id=tenant_id)
        seq, failures = 0, 0
    events = list(
        AuditEvent.objects.filter(tenant_id=tenant_id, seq__gt=seq).order_by("seq")[:limit]
    )
    # The tenant's endpoints as they are at the start of the pass, read once for its events,
    # and the people its emails go to, each read once.
    endpoints = active_endpoints(tenant_id) if events else []
    addressees = Addressees()
    # Their runs too, once for all of them (events.runs_named: at most two queries).
    runs = runs_named(tenant_id, events)
    reached = seq
    for audit_event in events:
        try:
            fan_out(audit_event=audit_event, endpoints=endpoints, addressees=addressees, runs=runs)
        except Exception:
            failures += 1
            if failures < MAX_FAILURES:
                logger.exception(
                    "fan-out of audit event %s (tenant %s #%s) failed; trying again next pass",
                    audit_event.pk,
                    tenant_id,
                    audit_event.seq,
                )
                break
            logger.error(
                "fan-out of audit event %s (tenant %s #%s) failed %s times; skipped, its "
                "notifications are not sent",
                audit_event.pk,
                tenant_id,
                audit_event.seq,
                failures,
                exc_info=True,
            )
        failures = 0
        reached = audit_event.seq
    # Compare-and-set: a pass that raced this one and already moved the cursor keeps it.
    FanOutCursor.objects.filter(tenant_id=tenant_id, seq=seq).update(
        seq=reached, failures=failures, updated_at=timezone.now()
    )
    return reached - seq


def active_endpoints(tenant_id: int) -> list[WebhookEndpoint]:
    """The tenant's active webhook endpoints (one query)."""
    return list(WebhookEndpoint.objects.filter(tenant_id=tenant_id, active=True))


def fan_out(
    *,
    audit_event: AuditEvent,
    endpoints: list[WebhookEndpoint] | None = None,
    addressees: Addressees | None = None,
    runs: Mapping[int, Run] | None = None,
) -> list[Delivery]:
    """Turn a committed audit event into deliveries and emails.

    endpoints: the tenant's active endpoints, as a pass read them once for all its events
    (active_endpoints); read here when not given. addressees: the pass's (emails.Addressees),
    so that its events read each person once. runs: the pass's events' runs
    (events.runs_named); the event's run is read here when it is not in it.
    Side effects: one Delivery row per active endpoint of the tenant that wants the event
    (idempotent per endpoint and event) with its delivery task enqueued; one EmailDelivery row
    per recipient (idempotent per recipient and event), its message rendered now, with its
    email task enqueued. Nothing at all for an audit action that does not notify. The run's
    outcome and a decision's message are read only when someone is to be told.
    """
    event = event_for(audit_event)
    # A checkpoint is delivered with its signed statement (fan_out_checkpoint), never as a
    # plain notification.
    if event is None or event == Event.AUDIT_CHECKPOINT:
        return []
    if endpoints is None:
        endpoints = active_endpoints(audit_event.tenant_id)
    # Filtered here, not in SQL: JSON containment differs between SQLite and PostgreSQL.
    endpoints = [e for e in endpoints if e.wants(event)]
    facts = facts_for(audit_event, event, outline=True, runs=runs)
    recipients = recipients_for(facts, audit_event.tenant_id, addressees=addressees)
    if not endpoints and not recipients:
        return []
    facts = in_full(facts)
    body = json.dumps(facts.payload(audit_event), separators=(",", ":"), sort_keys=True)
    now = timezone.now()
    with transaction.atomic():
        created = _deliveries(endpoints, audit_event, event, body, now)
        if recipients:
            subject, text = email_for(facts)
            create_emails(audit_event, event, subject, text, recipients, now)
        if created or recipients:
            hints.notify_admins_on_commit(audit_event.tenant_id, status=DeliveryStatus.PENDING)
    return created


def fan_out_checkpoint(*, audit_event: AuditEvent, checkpoint: dict) -> list[Delivery]:
    """Offer a tenant's signed checkpoint statement to its webhooks.

    checkpoint is the tenant's entry of approvals.audit.checkpoints (statement, signature,
    public key), sent with the audit.checkpointed event that recorded it. A receiver can keep it
    as a copy of the chain's head outside the console's database and check its signature.

    Side effects: one Delivery row (event audit.checkpoint, idempotent per endpoint and audit
    event) per active endpoint of the tenant that subscribed to audit.checkpoint, with its
    delivery task enqueued; no email.
    """
    active = WebhookEndpoint.objects.filter(tenant_id=audit_event.tenant_id, active=True)
    endpoints = [e for e in active if e.wants(Event.AUDIT_CHECKPOINT)]
    if not endpoints:
        return []
    tenant = checkpoint["statement"]["tenant"]
    payload = {
        # Stable across retries: receivers deduplicate on it.
        "id": f"{tenant}:{audit_event.seq}",
        "event": Event.AUDIT_CHECKPOINT.value,
        "action": audit_event.action,
        "tenant": tenant,
        "checkpoint": checkpoint,
        "time": audit_event.created_at.isoformat(),
        "url": public_url("approvals:audit"),
    }
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True)
    with transaction.atomic():
        created = _deliveries(endpoints, audit_event, Event.AUDIT_CHECKPOINT, body, timezone.now())
        if created:
            hints.notify_admins_on_commit(audit_event.tenant_id, status=DeliveryStatus.PENDING)
    return created


def _deliveries(endpoints, audit_event: AuditEvent, event: str, body: str, now) -> list[Delivery]:
    """One pending Delivery per endpoint (none twice for an audit event), its task enqueued."""
    created = []
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
    return created
