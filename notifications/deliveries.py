"""Webhook deliveries: sign and POST each one, retry with backoff, requeue lost ones, ping.

A delivery row is written by the fan-out with its payload; each attempt is claimed, signed
with the endpoint's secret, POSTed through the transport outside any transaction, and settled
(attempts). The payload carries ids, the tool name, the arguments digest, the status, the
actor and a link, never argument values: a receiver that needs them follows the link and
signs in.
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone
from django_tasks import task

from approvals.audit import chain
from approvals.core import crypto
from approvals.core.links import public_url
from approvals.live import hints
from notifications import signing, transport
from notifications.attempts import (
    QUEUE,
    claim,
    reopen,
    report,
    settle,
    still_claimed,
)
from notifications.emails import deliver_email_task
from notifications.endpoints import audited_host, endpoint_secret
from notifications.models import Delivery, DeliveryStatus, EmailDelivery, WebhookEndpoint

USER_AGENT = "approval-console-webhooks/1"


@task(queue_name=QUEUE)
def deliver_webhook_task(delivery_id: int) -> dict[str, int]:
    return report("webhook", [attempt(delivery_id)])


def message_id(delivery: Delivery) -> str:
    """The delivery's webhook-id: its payload's id (tenant and audit sequence number), the same
    on every attempt and retry, so a receiver deduplicates on either."""
    try:
        found = json.loads(delivery.payload).get("id")
    except (ValueError, AttributeError):
        found = None
    return found if isinstance(found, str) and found else f"delivery-{delivery.pk}"


def _send(endpoint: WebhookEndpoint, body: bytes, *, event: str, message_id: str):
    """POST a signed body to the endpoint (outside any transaction) and say how it went."""
    try:
        secret = endpoint_secret(endpoint)
    except crypto.CryptoError:
        return transport.Outcome(
            False, None, "the signing secret cannot be opened with the key ring", 0
        )
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Approvals-Event": event,
        # The wall clock, not the attempt's `now`: the receiver checks when it was really sent.
        **signing.headers(secret, body, message_id=message_id),
    }
    return transport.post(endpoint.url, body, headers)


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
    outcome = _send(
        delivery.endpoint,
        delivery.payload.encode(),
        event=delivery.event,
        message_id=message_id(delivery),
    )
    return _record(delivery, outcome, now)


def _record(delivery: Delivery, outcome: transport.Outcome, now: datetime) -> Delivery:
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
        hints.notify_admins_on_commit(
            delivery.tenant_id, delivery=delivery.pk, status=delivery.status
        )
    return delivery


def _audit_delivery(delivery: Delivery, action: str, *, actor) -> None:
    chain.append(
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
    now = now or timezone.now()
    found = 0
    with transaction.atomic():
        for model, deliver in (
            (Delivery, deliver_webhook_task),
            (EmailDelivery, deliver_email_task),
        ):
            stale = list(
                model.objects.select_for_update()
                .filter(status=DeliveryStatus.PENDING, next_attempt_at__lt=now - STALE)
                .values_list("pk", flat=True)[:500]
            )
            if not stale:
                continue
            model.objects.filter(pk__in=stale).update(next_attempt_at=now, updated_at=now)
            for pk in stale:
                deliver.enqueue(pk)
            found += len(stale)
    return found


def retry(delivery: Delivery, *, user) -> Delivery:
    """Send a failed delivery again from its first attempt.

    Side effects: the delivery goes back to pending with attempts 0 (compare-and-set on
    failed, so two clicks retry once); audit webhook.retried; its task enqueued.
    """
    with transaction.atomic():
        reopen(Delivery.objects, delivery.pk, "delivery")
        delivery.refresh_from_db()
        _audit_delivery(delivery, "webhook.retried", actor=user)
        deliver_webhook_task.enqueue(delivery.pk)
        hints.notify_admins_on_commit(
            delivery.tenant_id, delivery=delivery.pk, status=delivery.status
        )
    return delivery


# --- test ping ------------------------------------------------------------------------------


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
        "url": public_url("notifications:webhook", tenant.slug, endpoint.pk),
    }
    body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    outcome = _send(endpoint, body, event=PING_EVENT, message_id=payload["id"])
    with transaction.atomic():
        chain.append(
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
