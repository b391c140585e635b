"""What notifications does when approvals sends audit_checkpointed, worker_housekeeping and
secrets_rotating."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.audit import checkpoints
from approvals.core import signatures
from approvals.core.canonical import canonical_json
from approvals.models import AuditEvent, Role
from approvals.signals import Rotation, secrets_rotating, worker_housekeeping
from notifications import receivers
from notifications.deliveries import deliver_webhook_task
from notifications.endpoints import endpoint_secret
from notifications.models import Delivery, DeliveryStatus, EmailDelivery, Event, WebhookEndpoint
from tests.notifications.conftest import make_endpoint
from tests.notifications.test_deliveries import one_delivery
from tests.notifications.test_email_log import email_row
from tests.support import TenantFactory, member

pytestmark = pytest.mark.django_db

DELIVER_TASK = "notifications.deliveries.deliver_webhook_task"
EMAIL_TASK = "notifications.emails.deliver_email_task"


def answer(signal, receiver):
    """What receiver answered when signal was sent as approvals sends it."""
    return dict(signal.send(sender=None))[receiver]


def queued(task_path: str) -> list[int]:
    return sorted(
        t.args_kwargs["args"][0] for t in DBTaskResult.objects.filter(task_path=task_path)
    )


def test_worker_housekeeping_gives_lost_deliveries_and_emails_their_task_again(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    lost = one_delivery(tenant, endpoint)
    lost_email = email_row(tenant)
    DBTaskResult.objects.all().delete()  # the worker died with the tasks
    overdue = timezone.now() - timedelta(minutes=3)
    Delivery.objects.filter(pk=lost.pk).update(next_attempt_at=overdue)
    EmailDelivery.objects.filter(pk=lost_email.pk).update(next_attempt_at=overdue)
    fresh = one_delivery(tenant, endpoint, action="run.completed")

    said = answer(worker_housekeeping, receivers._requeue_stale)

    assert said == "re-enqueued 2 webhook and email deliveries"
    # The fresh delivery's own task, and one again for each lost row.
    assert queued(DELIVER_TASK) == sorted([lost.pk, fresh.pk])
    assert queued(EMAIL_TASK) == [lost_email.pk]
    lost.refresh_from_db()
    assert lost.status == DeliveryStatus.PENDING
    assert lost.next_attempt_at > overdue + timedelta(minutes=2)


def test_worker_housekeeping_says_nothing_when_nothing_was_lost(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    one_delivery(tenant, endpoint)  # due now, its task queued

    assert answer(worker_housekeeping, receivers._requeue_stale) == ""
    assert len(queued(DELIVER_TASK)) == 1


def test_secrets_rotating_reseals_webhook_secrets_under_the_new_primary_key(
    tenant, admin, settings
):
    endpoint, secret = make_endpoint(tenant, admin)
    broken, _ = make_endpoint(tenant, admin)
    sealed = bytes(WebhookEndpoint.objects.get(pk=broken.pk).secret_ciphertext)
    WebhookEndpoint.objects.filter(pk=broken.pk).update(
        secret_ciphertext=bytes([sealed[0] ^ 1]) + sealed[1:]
    )
    old = list(settings.APPROVALS_ENCRYPTION_KEYS)
    settings.APPROVALS_ENCRYPTION_KEYS = [("new1", b"k" * 32), *old]

    rotation = answer(secrets_rotating, receivers._rotate_webhook_secrets)

    assert rotation == Rotation("webhook secrets", rotated=1, failed=1)
    stored = WebhookEndpoint.objects.get(pk=endpoint.pk)
    assert stored.secret_key_id == "new1"
    assert endpoint_secret(stored) == secret
    # The one that cannot be opened stays as it was, under the old key.
    assert WebhookEndpoint.objects.get(pk=broken.pk).secret_key_id == old[0][0]


def test_audit_checkpoint_reaches_a_receiver_on_loopback_as_a_signed_event(
    tenant, admin, receiver, tmp_path, django_capture_on_commit_callbacks
):
    endpoint, secret = make_endpoint(
        tenant, admin, url=receiver.url, events=[Event.AUDIT_CHECKPOINT]
    )
    receiver.secrets.append(secret)
    globex = TenantFactory(slug="globex")
    foreign, _ = make_endpoint(globex, member(globex, Role.ADMIN), events=[Event.AUDIT_CHECKPOINT])
    path = tmp_path / "checkpoint.json"

    with django_capture_on_commit_callbacks(execute=True):
        call_command("audit_checkpoint", "--output", str(path), stdout=StringIO())
    delivery = Delivery.objects.get(endpoint=endpoint)
    result = deliver_webhook_task.call(delivery.pk)

    assert result == {"delivered": 1, "failed": 0, "skipped": 0}
    assert [(r.line, r.verified) for r in receiver.received] == [
        ("verified audit.checkpoint", True)
    ]
    payload = json.loads(receiver.received[0].body)
    checkpointed = AuditEvent.objects.get(tenant=tenant, action="audit.checkpointed")
    assert (payload["id"], payload["event"], payload["tenant"]) == (
        f"acme:{checkpointed.seq}",
        "audit.checkpoint",
        "acme",
    )
    # The statement the file holds for this tenant, signed with the checkpoint's key: a
    # receiver checks it with the public key alone, and keeps it outside the console.
    (statement,) = [
        s
        for s in checkpoints.load(path.read_text(), public_key=signatures.public_key())
        if s.tenant == "acme"
    ]
    checkpoint = payload["checkpoint"]
    assert checkpoint["statement"] == statement.fields()
    assert checkpoint["public_key"] == signatures.public_key()
    signatures.verify(
        checkpoint["public_key"],
        checkpoint["signature"],
        canonical_json(checkpoint["statement"]).encode(),
    )
    # Each tenant's webhooks get its own statement, never another tenant's.
    foreign_payload = json.loads(Delivery.objects.get(endpoint=foreign).payload)
    assert (foreign_payload["tenant"], foreign_payload["checkpoint"]["statement"]["tenant"]) == (
        "globex",
        "globex",
    )
