"""Deliveries: signed POSTs to a real receiver on loopback, retries with backoff, final failure."""

from __future__ import annotations

import base64
import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import transaction
from django.utils import timezone
from django_tasks_db.models import DBTaskResult
from standardwebhooks import Webhook, WebhookVerificationError

from approvals.audit import chain as audit
from approvals.models import AuditEvent, Role, Ticket
from notifications import attempts, deliveries, endpoints, fan_out, signing, transport
from notifications.deliveries import deliver_webhook_task
from notifications.models import Delivery, DeliveryStatus, Event, WebhookEndpoint
from tests.notifications.conftest import make_endpoint
from tests.support import member, paused_run

pytestmark = pytest.mark.django_db

DELIVER_TASK = "notifications.deliveries.deliver_webhook_task"


def one_delivery(tenant, endpoint, action="ticket.escalated") -> Delivery:
    with transaction.atomic():
        event = audit.append(
            tenant_id=tenant.pk,
            action=action,
            actor_name="policy",
            tool_name="deploy_release",
            arguments_digest="ab" * 32,
            outcome="pending",
        )
    fan_out.fan_out(audit_event=event)
    return Delivery.objects.get(endpoint=endpoint, audit_event_id=event.pk)


def test_delivery_is_signed_and_verified_by_a_receiver_on_loopback(tenant, admin, receiver):
    endpoint, secret = make_endpoint(tenant, admin, url=receiver.url)
    receiver.secrets.append(secret)
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, username="req"))
    ticket = Ticket.objects.get(run=run)
    created = AuditEvent.objects.get(action="ticket.created", ticket=ticket)
    fan_out.fan_out(audit_event=created)
    delivery = Delivery.objects.get(endpoint=endpoint)

    result = deliver_webhook_task.call(delivery.pk)

    delivery.refresh_from_db()
    assert result == {"delivered": 1, "failed": 0, "skipped": 0}
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("delivered", 1, 204)
    assert delivery.last_error == ""
    assert delivery.last_duration_ms is not None
    assert [r.verified for r in receiver.received] == [True]
    # Standard Webhooks: any receiver verifies with the off-the-shelf library and the secret.
    request = receiver.received[0]
    assert Webhook(secret).verify(request.body, request.headers) == json.loads(request.body)
    assert request.headers["webhook-id"] == f"acme:{created.seq}"
    assert request.headers["webhook-signature"].startswith("v1,")
    payload = json.loads(receiver.received[0].body)
    assert payload == {
        "id": f"acme:{created.seq}",
        "event": "ticket.created",
        "action": "ticket.created",
        "tenant": "acme",
        "ticket": ticket.pk,
        "run": run.pk,
        "run_title": run.title,
        "tool": "deploy_release",
        "arguments_digest": ticket.arguments_digest,
        "status": "pending",
        "actor": "req",
        "time": created.created_at.isoformat(),
        "url": f"http://127.0.0.1:8000/tickets/{ticket.pk}/",
    }
    # Argument values never leave the console: only their digest does.
    assert "2026.07.24" not in json.dumps({k: v for k, v in payload.items() if k != "run_title"})
    assert "production" not in receiver.received[0].body.decode().replace(run.title, "")
    assert AuditEvent.objects.filter(action="webhook.delivered").count() == 1


def test_delivery_with_the_wrong_secret_is_refused_by_the_receiver(tenant, admin, receiver):
    endpoint, _ = make_endpoint(tenant, admin, url=receiver.url)
    receiver.secrets.append("whsec_not-the-right-one")
    delivery = one_delivery(tenant, endpoint)

    deliveries.attempt(delivery.pk)

    delivery.refresh_from_db()
    assert [r.verified for r in receiver.received] == [False]
    assert (delivery.status, delivery.last_status_code, delivery.last_error) == (
        "pending",
        401,
        "HTTP 401",
    )


def test_signing_a_tampered_body_an_old_timestamp_or_another_secret_fails_to_verify():
    secret = signing.new_secret()
    body = b'{"event":"ticket.created"}'
    headers = signing.headers(secret, body, message_id="acme:7")
    old = signing.headers(
        secret, body, message_id="acme:7", timestamp=timezone.now() - timedelta(seconds=301)
    )

    assert Webhook(secret).verify(body, headers) == {"event": "ticket.created"}
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(secret).verify(b'{"event":"ticket.decided"}', headers)
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(secret).verify(body, {**headers, "webhook-id": "acme:8"})
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(secret).verify(body, old)
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(signing.new_secret()).verify(body, headers)
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:], validate=True)) == 32


def test_an_older_endpoints_url_safe_secret_keeps_working_as_the_same_key(tenant, admin, receiver):
    """Secrets made before were whsec_ + URL-safe base64 (- and _): the same 32 bytes of key,
    written in the standard alphabet; deliveries sign with it and rotation stores it so."""
    key = bytes([0xFB, 0xEF, 0xFF] * 10 + [0xFE, 0xFF])  # "-" and "_" in URL-safe base64
    legacy = "whsec_" + base64.urlsafe_b64encode(key).decode().rstrip("=")
    assert "-" in legacy and "_" in legacy
    endpoint, _ = make_endpoint(tenant, admin, url=receiver.url)
    endpoints._seal_secret(endpoint, legacy)  # as an older version stored it
    endpoint.save(update_fields=["secret_key_id", "secret_nonce", "secret_ciphertext"])
    standard = "whsec_" + base64.b64encode(key).decode()
    receiver.secrets.append(standard)

    delivery = deliveries.attempt(one_delivery(tenant, endpoint).pk)

    assert endpoints.endpoint_secret(endpoint) == standard == signing.standard_secret(legacy)
    assert (delivery.status, [r.verified for r in receiver.received]) == ("delivered", [True])
    request = receiver.received[0]
    assert Webhook(bytes(key)).verify(request.body, request.headers)["event"] == "ticket.escalated"


def test_delivery_keeps_its_webhook_id_on_every_attempt_and_retry(tenant, admin, failing_receiver):
    endpoint, secret = make_endpoint(tenant, admin, url=failing_receiver.url)
    failing_receiver.secrets.append(secret)
    delivery = one_delivery(tenant, endpoint)
    now = timezone.now()
    for _ in range(attempts.MAX_ATTEMPTS):
        delivery = deliveries.attempt(delivery.pk, now=now)
        now = delivery.next_attempt_at or now
    deliveries.retry(delivery, user=admin)
    deliveries.attempt(delivery.pk)

    ids = [r.headers["webhook-id"] for r in failing_receiver.received]
    payload = json.loads(failing_receiver.received[0].body)
    assert ids == [payload["id"]] * (attempts.MAX_ATTEMPTS + 1)
    assert payload["id"] == f"acme:{delivery.audit_event.seq}"
    assert all(
        Webhook(secret).verify(r.body, r.headers) == payload for r in failing_receiver.received
    )


def test_delivery_failing_receiver_is_retried_with_backoff_then_failed_and_audited(
    tenant, admin, failing_receiver
):
    endpoint, secret = make_endpoint(tenant, admin, url=failing_receiver.url)
    failing_receiver.secrets.append(secret)
    delivery = one_delivery(tenant, endpoint)
    now = timezone.now()
    waits = []

    for attempt in range(1, attempts.MAX_ATTEMPTS + 1):
        # Too early: nothing is sent before the next attempt's time.
        if attempt > 1:
            assert deliveries.attempt(delivery.pk, now=now - timedelta(seconds=2)) is None
        delivery = deliveries.attempt(delivery.pk, now=now)
        assert delivery.attempts == attempt
        if delivery.next_attempt_at:
            waits.append(delivery.next_attempt_at - now)
            now = delivery.next_attempt_at

    assert waits == [
        timedelta(seconds=10),
        timedelta(minutes=1),
        timedelta(minutes=5),
        timedelta(minutes=30),
    ]
    assert (delivery.status, delivery.last_status_code, delivery.last_error) == (
        DeliveryStatus.FAILED,
        500,
        "HTTP 500",
    )
    assert len(failing_receiver.verified) == attempts.MAX_ATTEMPTS
    # One task per attempt: the first from the fan-out, four scheduled after their backoff.
    run_afters = sorted(
        DBTaskResult.objects.filter(task_path=DELIVER_TASK).values_list("run_after", flat=True)
    )
    assert len(run_afters) == attempts.MAX_ATTEMPTS
    failed = AuditEvent.objects.get(action="webhook.failed")
    assert failed.outcome == "failed"
    assert failed.detail == {
        "delivery": delivery.pk,
        "endpoint": endpoint.pk,
        "event": "ticket.escalated",
        "audit_event": delivery.audit_event_id,
        "attempts": 5,
        "status_code": 500,
        "error": "HTTP 500",
    }
    # Only the final failure is audited, and a finished delivery is never sent again.
    assert AuditEvent.objects.filter(action__startswith="webhook.").count() == 2  # + created
    assert deliveries.attempt(delivery.pk, now=now + timedelta(days=1)) is None


def test_delivery_a_redirect_is_not_followed(tenant, admin):
    hits = []

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            hits.append(self.path)
            self.send_response(302)
            self.send_header("Location", "/elsewhere")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        endpoint, _ = make_endpoint(tenant, admin, url=url)
        delivery = deliveries.attempt(one_delivery(tenant, endpoint).pk)
    finally:
        server.shutdown()
        server.server_close()

    assert hits == ["/hook"]
    assert (delivery.status, delivery.last_status_code) == ("pending", 302)
    assert delivery.last_error == "HTTP 302: redirects are not followed"


def test_delivery_connection_refused_is_a_short_error(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin, url="http://127.0.0.1:9/hook")

    delivery = deliveries.attempt(one_delivery(tenant, endpoint).pk)

    assert delivery.status == "pending"
    assert delivery.last_status_code is None
    assert delivery.last_error.startswith("cannot connect:")
    assert len(delivery.last_error) <= 200


def test_delivery_to_a_non_http_url_is_refused_without_a_request(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url="file:///etc/passwd")

    delivery = deliveries.attempt(one_delivery(tenant, endpoint).pk)

    assert delivery.last_error == "Enter an http:// or https:// URL with a host name."


def test_delivery_of_a_deleted_endpoint_does_nothing(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    delivery = one_delivery(tenant, endpoint)
    endpoints.delete_endpoint(endpoint, user=admin)

    assert deliver_webhook_task.call(delivery.pk) == {"delivered": 0, "failed": 0, "skipped": 1}


def test_fan_out_only_for_selected_events(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin, events=[Event.RUN_COMPLETED])
    with transaction.atomic():
        event = audit.append(tenant_id=tenant.pk, action="ticket.escalated", actor_name="x")

    assert fan_out.fan_out(audit_event=event) == []
    assert Delivery.objects.filter(endpoint=endpoint).count() == 0


def test_the_verification_snippet_in_the_docs_accepts_a_delivery_and_refuses_the_rest(
    tenant, admin, receiver
):
    """docs/NOTIFICATIONS.md shows receivers how to verify; the snippet must really work."""
    import re
    from pathlib import Path

    endpoint, secret = make_endpoint(tenant, admin, url=receiver.url)
    receiver.secrets.append(secret)
    deliveries.attempt(one_delivery(tenant, endpoint).pk)
    request = receiver.received[0]
    doc = (Path(__file__).resolve().parents[2] / "docs" / "NOTIFICATIONS.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    namespace: dict = {"SECRET": secret}
    exec(snippet, namespace)  # noqa: S102 - our own documentation
    receive = namespace["receive"]
    old = signing.headers(
        secret,
        request.body,
        message_id=request.headers["webhook-id"],
        timestamp=timezone.now() - timedelta(minutes=6),
    )

    assert receive(request.body, request.headers) == json.loads(request.body)
    assert receive(request.body.replace(b"acme", b"evil"), request.headers) is None
    assert receive(request.body, old) is None
    assert receive(request.body, {**request.headers, "webhook-signature": "garbage"}) is None


def test_requeue_stale_gives_a_lost_delivery_its_task_once(tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    delivery = one_delivery(tenant, endpoint)
    DBTaskResult.objects.all().delete()  # the worker died with the task
    now = timezone.now()
    Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=now - timedelta(minutes=3))
    fresh = one_delivery(tenant, endpoint, action="run.completed")

    assert deliveries.requeue_stale(now=now) == 1
    assert deliveries.requeue_stale(now=now + timedelta(seconds=10)) == 0

    # The fresh delivery's own task, and one again for the lost one.
    tasks = DBTaskResult.objects.filter(task_path=DELIVER_TASK)
    assert sorted(t.args_kwargs["args"][0] for t in tasks) == [delivery.pk, fresh.pk]


def test_delivery_whose_endpoint_is_deleted_mid_attempt_records_nothing(tenant, admin, monkeypatch):
    endpoint, _ = make_endpoint(tenant, admin)
    delivery = one_delivery(tenant, endpoint)

    def post_while_deleted(url, body, headers):
        endpoints.delete_endpoint(WebhookEndpoint.objects.get(pk=endpoint.pk), user=admin)
        return transport.Outcome(False, 500, "HTTP 500", 3)

    monkeypatch.setattr(transport, "post", post_while_deleted)
    deliveries.attempt(delivery.pk)

    assert Delivery.objects.count() == 0
    assert DBTaskResult.objects.filter(task_path=DELIVER_TASK).count() == 1  # the fan-out's


def test_delivery_task_whose_every_attempt_failed_is_failed_not_successful(
    tenant, admin, failing_receiver
):
    """The queue records a task that raised as FAILED: one that only returned would be logged
    SUCCESSFUL although nothing was delivered."""
    endpoint, secret = make_endpoint(tenant, admin, url=failing_receiver.url)
    failing_receiver.secrets.append(secret)
    delivery = one_delivery(tenant, endpoint)

    with pytest.raises(attempts.DeliveryFailed) as failed:
        deliver_webhook_task.call(delivery.pk)

    assert str(failed.value) == "webhook deliveries: 0 delivered, 1 failed (1 to be retried)"
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.PENDING, 1)
