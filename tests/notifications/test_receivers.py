"""What notifications does when approvals sends worker_housekeeping and secrets_rotating."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.signals import Rotation, secrets_rotating, worker_housekeeping
from notifications import receivers
from notifications.endpoints import endpoint_secret
from notifications.models import Delivery, DeliveryStatus, EmailDelivery, WebhookEndpoint
from tests.notifications.conftest import make_endpoint
from tests.notifications.test_deliveries import one_delivery
from tests.notifications.test_email_log import email_row

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
