"""A test event sent from the webhook's page, and the delivery log kept live for admins."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction
from django.urls import reverse

from approvals.audit import chain as audit
from approvals.live import hints as live
from approvals.live import tail
from approvals.models import AuditEvent, Role
from notifications import deliveries, emails
from notifications.models import Delivery, DeliveryStatus, Event
from tests.notifications.conftest import make_endpoint
from tests.notifications.test_views import failed_delivery
from tests.support import ORIGIN, TenantFactory, member, session_cookie, socket

pytestmark = pytest.mark.django_db


def ping_url(endpoint) -> str:
    return reverse("notifications:ping", args=[endpoint.tenant.slug, endpoint.pk])


def test_ping_sends_one_signed_ping_and_says_what_the_receiver_answered(
    client, tenant, admin, receiver
):
    # Inactive and listening to one event only: a test is for before switching it on.
    endpoint, secret = make_endpoint(
        tenant, admin, url=receiver.url, events=[Event.RUN_FAILED], active=False
    )
    receiver.secrets.append(secret)
    client.force_login(admin)

    response = client.post(ping_url(endpoint), follow=True)

    assert response.redirect_chain == [
        (reverse("notifications:webhook", args=["acme", endpoint.pk]), 302)
    ]
    page = response.content.decode()
    assert f"Test event delivered to webhook {endpoint.pk}: HTTP 204 in " in page
    assert [r.verified for r in receiver.received] == [True]
    body = json.loads(receiver.received[0].body)
    assert (body["event"], body["webhook"], body["tenant"], body["ticket"], body["run"]) == (
        "ping",
        endpoint.pk,
        "acme",
        None,
        None,
    )
    assert body["actor"] == "acme-admin"
    assert body["url"].endswith(f"/notifications/acme/webhooks/{endpoint.pk}/")
    assert Delivery.objects.count() == 0  # not in the delivery log, never retried
    pinged = AuditEvent.objects.get(action="webhook.pinged")
    assert (pinged.actor_id, pinged.outcome) == (admin.pk, DeliveryStatus.DELIVERED)
    assert pinged.detail["status_code"] == 204
    assert pinged.detail["host"] == receiver.url.rsplit("/", 1)[0]


def test_ping_to_a_failing_receiver_shows_its_answer_and_what_to_check(
    client, tenant, admin, failing_receiver
):
    endpoint, secret = make_endpoint(tenant, admin, url=failing_receiver.url)
    failing_receiver.secrets.append(secret)
    client.force_login(admin)

    page = client.post(ping_url(endpoint), follow=True).content.decode()

    assert f"Test event to webhook {endpoint.pk} failed: HTTP 500 (in " in page
    assert "answers 2xx to a signed POST" in page
    assert len(failing_receiver.received) == 1
    pinged = AuditEvent.objects.get(action="webhook.pinged")
    assert (pinged.outcome, pinged.detail["status_code"]) == (DeliveryStatus.FAILED, 500)


def test_ping_to_a_closed_port_says_it_cannot_connect(client, tenant, admin, receiver):
    # A receiver that was started and stopped leaves a port nothing listens on.
    import socket as sockets

    with sockets.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint, _ = make_endpoint(tenant, admin, url=f"http://127.0.0.1:{port}/hook")
    client.force_login(admin)

    page = client.post(ping_url(endpoint), follow=True).content.decode()

    assert "failed: cannot connect:" in page
    assert AuditEvent.objects.get(action="webhook.pinged").detail["status_code"] is None


@pytest.mark.parametrize("role", [Role.VIEWER, Role.APPROVER, Role.AUDITOR])
def test_ping_is_404_for_non_admins_and_405_for_get(client, tenant, admin, receiver, role):
    endpoint, _ = make_endpoint(tenant, admin, url=receiver.url)
    client.force_login(member(tenant, role))
    assert client.post(ping_url(endpoint)).status_code == 404
    client.force_login(admin)
    assert client.get(ping_url(endpoint)).status_code == 405
    other = TenantFactory(slug="globex")
    theirs, _ = make_endpoint(other, member(other, Role.ADMIN), url=receiver.url)
    assert client.post(reverse("notifications:ping", args=["acme", theirs.pk])).status_code == 404
    assert receiver.received == []
    assert not AuditEvent.objects.filter(action="webhook.pinged").exists()


def test_delivery_log_live_reread_returns_the_rows_alone(client, tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    delivery = failed_delivery(tenant, endpoint)
    client.force_login(admin)
    url = reverse("notifications:deliveries", args=["acme"])

    partial = client.get(url, headers={"HX-Request": "true", "HX-Target": "delivery-rows"})
    whole = client.get(url)

    rows = partial.content.decode()
    assert partial.status_code == 200
    assert rows.lstrip().startswith('<div id="delivery-rows"')
    assert f'data-delivery="{delivery.pk}" data-status="failed"' in rows
    assert "<html" not in rows and "Filter" not in rows
    assert 'hx-trigger="console:changed from:body, console:deliveries from:body"' in (
        whole.content.decode()
    )


def test_delivery_changes_hint_the_tenants_admins_only(
    tenant, admin, monkeypatch, django_capture_on_commit_callbacks
):
    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(live, "_send", lambda group, message: sent.append((group, message)))
    endpoint, _ = make_endpoint(tenant, admin)
    delivery = failed_delivery(tenant, endpoint)  # fan-out, then marked failed by hand

    with django_capture_on_commit_callbacks(execute=True):
        deliveries.retry(delivery, user=admin)
        assert sent == []  # nothing before the commit

    assert sent == [
        (
            f"tenant.{tenant.pk}.admins",
            {
                "type": "console.event",
                "kind": "delivery.changed",
                "tenant": tenant.pk,
                "delivery": delivery.pk,
                "status": "pending",
            },
        )
    ]


def test_audit_tail_sends_webhook_events_to_the_admins_group(tenant):
    with transaction.atomic():
        delivered = audit.append(tenant_id=tenant.pk, action="webhook.delivered", actor_name="n")
        created = audit.append(tenant_id=tenant.pk, action="ticket.created", actor_name="n")

    hints = [live.hint_for(event) for event in (delivered, created)]

    assert [h["kind"] for h in hints] == ["delivery.changed", "ticket.created"]
    assert [live.group_for(tenant.pk, h) for h in hints] == [
        f"tenant.{tenant.pk}.admins",
        f"tenant.{tenant.pk}",
    ]


@pytest.mark.django_db(transaction=True)
def test_consumer_tells_admins_of_a_delivery_change_and_approvers_nothing(settings, monkeypatch):
    settings.APPROVALS_LIVE_POLL_SECONDS = 0.05
    monkeypatch.setattr(tail, "audit_tail", tail.AuditTail())
    tenant = TenantFactory(slug="acme")
    admin = member(tenant, Role.ADMIN, username="acme-admin")
    endpoint, _ = make_endpoint(tenant, admin)
    delivery = failed_delivery(tenant, endpoint)
    admin_cookie = session_cookie(admin)
    approver_cookie = session_cookie(member(tenant, Role.APPROVER))

    async def scenario():
        await get_channel_layer().flush()
        admin_socket, approver_socket = (
            socket(ORIGIN, admin_cookie),
            socket(ORIGIN, approver_cookie),
        )
        assert (await admin_socket.connect())[0] and (await approver_socket.connect())[0]
        try:
            await database_sync_to_async(deliveries.retry)(delivery, user=admin)
            hint = await admin_socket.receive_from(timeout=5)
            quiet = await approver_socket.receive_nothing(timeout=0.5)
            return hint, quiet
        finally:
            await admin_socket.disconnect()
            await approver_socket.disconnect()

    hint, quiet = async_to_sync(scenario)()

    assert 'data-kind="delivery.changed"' in hint
    assert quiet is True


def test_email_log_live_reread_and_email_hints_go_to_admins(
    client, tenant, admin, monkeypatch, django_capture_on_commit_callbacks
):
    from tests.notifications.test_email_log import failed_email

    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(live, "_send", lambda group, message: sent.append((group, message)))
    email = failed_email(tenant)
    client.force_login(admin)
    url = reverse("notifications:emails", args=["acme"])

    rows = client.get(url, headers={"HX-Request": "true", "HX-Target": "email-rows"})
    with django_capture_on_commit_callbacks(execute=True):
        emails.retry_email(email, user=admin)

    assert rows.status_code == 200
    assert rows.content.decode().lstrip().startswith('<div id="email-rows"')
    assert f'data-email="{email.pk}" data-status="failed"' in rows.content.decode()
    assert sent[-1] == (
        f"tenant.{tenant.pk}.admins",
        {
            "type": "console.event",
            "kind": "delivery.changed",
            "tenant": tenant.pk,
            "email": email.pk,
            "status": "pending",
        },
    )


def test_ping_is_refused_by_the_guard_and_reaches_nobody(client, tenant, admin, receiver, settings):
    endpoint, _ = make_endpoint(tenant, admin, url=receiver.url)  # saved while allowed
    settings.NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS = False
    client.force_login(admin)

    page = client.post(ping_url(endpoint), follow=True).content.decode()

    assert "failed: refused: 127.0.0.1 is a loopback address" in page
    assert receiver.received == []
    assert AuditEvent.objects.get(action="webhook.pinged").outcome == DeliveryStatus.FAILED
