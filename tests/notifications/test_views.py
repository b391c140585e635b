"""Webhook pages: admins of the tenant only; the secret shown once; the log and its retry."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.urls import reverse
from django_tasks_db.models import DBTaskResult

from approvals.audit import chain as audit
from approvals.models import AuditEvent, Role
from notifications import endpoints, fan_out
from notifications.models import Delivery, DeliveryStatus, Event, WebhookEndpoint
from tests.notifications.conftest import make_endpoint
from tests.support import TenantFactory, member

pytestmark = pytest.mark.django_db

DELIVER_TASK = "notifications.deliveries.deliver_webhook_task"


def webhooks_url(slug="acme") -> str:
    return reverse("notifications:webhooks", args=[slug])


def failed_delivery(tenant, endpoint) -> Delivery:
    with transaction.atomic():
        event = audit.append(tenant_id=tenant.pk, action="run.failed", actor_name="worker")
    fan_out.fan_out(audit_event=event)
    delivery = Delivery.objects.get(endpoint=endpoint, audit_event_id=event.pk)
    Delivery.objects.filter(pk=delivery.pk).update(
        status=DeliveryStatus.FAILED, attempts=5, last_status_code=500, last_error="HTTP 500"
    )
    DBTaskResult.objects.all().delete()
    return Delivery.objects.get(pk=delivery.pk)


def test_webhooks_create_shows_the_secret_once_and_never_again(client, tenant, admin):
    client.force_login(admin)

    response = client.post(
        webhooks_url(),
        {
            "url": "https://hooks.example.com/approvals",
            "description": "chat",
            "events": ["ticket.created", "run.failed"],
            "active": "on",
        },
    )

    endpoint = WebhookEndpoint.objects.get()
    secret = endpoints.endpoint_secret(endpoint)
    page = response.content.decode()
    assert response.status_code == 201
    assert secret in page
    assert "not shown again" in page
    assert response.headers["Cache-Control"].startswith("max-age=0")
    assert (endpoint.url, endpoint.events, endpoint.active) == (
        "https://hooks.example.com/approvals",
        ["run.failed", "ticket.created"],
        True,
    )
    assert AuditEvent.objects.filter(action="webhook.created").count() == 1
    for url in (webhooks_url(), reverse("notifications:webhook", args=["acme", endpoint.pk])):
        again = client.get(url)
        assert again.status_code == 200
        assert secret not in again.content.decode()


@pytest.mark.parametrize(
    "url",
    ["ftp://hooks.example.com/x", "javascript:alert(1)", "file:///etc/passwd", "not a url", ""],
)
def test_webhooks_create_refuses_a_non_http_url_with_a_form_error(client, tenant, admin, url):
    client.force_login(admin)

    response = client.post(webhooks_url(), {"url": url, "events": ["ticket.created"]})

    assert response.status_code == 400
    assert 'id="url-errors"' in response.content.decode()
    assert WebhookEndpoint.objects.count() == 0


def test_webhooks_create_needs_an_event(client, tenant, admin):
    client.force_login(admin)

    response = client.post(webhooks_url(), {"url": "https://hooks.example.com/"})

    assert response.status_code == 400
    assert "This field is required." in response.content.decode()
    assert WebhookEndpoint.objects.count() == 0


@pytest.mark.parametrize("role", [Role.VIEWER, Role.APPROVER, Role.AUDITOR])
def test_webhooks_pages_are_404_for_non_admins(client, tenant, admin, role):
    endpoint, _ = make_endpoint(tenant, admin)
    delivery = failed_delivery(tenant, endpoint)
    client.force_login(member(tenant, role))

    statuses = [
        client.get(reverse("notifications:index")).status_code,
        client.get(webhooks_url()).status_code,
        client.post(webhooks_url(), {"url": "https://x.example/", "events": ["run.failed"]}),
        client.get(reverse("notifications:webhook", args=["acme", endpoint.pk])).status_code,
        client.post(reverse("notifications:delete", args=["acme", endpoint.pk])).status_code,
        client.get(reverse("notifications:deliveries", args=["acme"])).status_code,
        client.post(reverse("notifications:retry", args=["acme", delivery.pk])).status_code,
    ]

    statuses[2] = statuses[2].status_code
    assert statuses == [404] * 7
    assert WebhookEndpoint.objects.count() == 1
    assert Delivery.objects.get(pk=delivery.pk).status == DeliveryStatus.FAILED


def test_webhooks_another_tenants_webhook_is_404_even_under_ones_own_slug(client, tenant, admin):
    other = TenantFactory(slug="globex")
    theirs, _ = make_endpoint(other, member(other, Role.ADMIN), url="https://globex.example/")
    their_delivery = failed_delivery(other, theirs)
    client.force_login(admin)

    statuses = [
        client.get(webhooks_url("globex")).status_code,
        client.get(reverse("notifications:webhook", args=["acme", theirs.pk])).status_code,
        client.get(reverse("notifications:webhook", args=["globex", theirs.pk])).status_code,
        client.post(reverse("notifications:delete", args=["acme", theirs.pk])).status_code,
        client.post(reverse("notifications:retry", args=["acme", their_delivery.pk])).status_code,
        client.get(reverse("notifications:deliveries", args=["globex"])).status_code,
    ]
    log = client.get(reverse("notifications:deliveries", args=["acme"]), {"endpoint": theirs.pk})

    assert statuses == [404] * 6
    assert log.status_code == 400
    assert "globex.example" not in log.content.decode()
    assert WebhookEndpoint.objects.filter(pk=theirs.pk).exists()
    assert Delivery.objects.get(pk=their_delivery.pk).status == DeliveryStatus.FAILED


def test_webhooks_index_redirects_to_the_admins_tenant(client, tenant, admin):
    client.force_login(admin)

    response = client.get(reverse("notifications:index"))

    assert response.status_code == 302
    assert response.url == webhooks_url()


def test_webhooks_list_shows_endpoints_and_the_nav_link(client, tenant, admin):
    make_endpoint(tenant, admin, url="https://hooks.example.com/one", events=[Event.RUN_FAILED])
    client.force_login(admin)

    page = client.get(webhooks_url()).content.decode()

    assert "https://hooks.example.com/one" in page
    assert "Run failed, expired or in doubt" in page
    assert f'href="{reverse("notifications:index")}"' in page


def test_webhooks_nav_link_is_hidden_from_non_admins(client, tenant):
    client.force_login(member(tenant, Role.APPROVER))

    page = client.get(reverse("approvals:queue")).content.decode()

    assert reverse("notifications:index") not in page


def test_webhook_edit_changes_events_and_active_and_keeps_the_secret(client, tenant, admin):
    endpoint, secret = make_endpoint(tenant, admin)
    client.force_login(admin)

    response = client.post(
        reverse("notifications:webhook", args=["acme", endpoint.pk]),
        {"url": "http://hooks.internal:8080/x", "description": "", "events": ["run.completed"]},
    )

    endpoint.refresh_from_db()
    assert response.status_code == 302
    assert (endpoint.url, endpoint.events, endpoint.active) == (
        "http://hooks.internal:8080/x",
        ["run.completed"],
        False,
    )
    assert endpoints.endpoint_secret(endpoint) == secret
    assert AuditEvent.objects.filter(action="webhook.changed").count() == 1


def test_webhook_edit_refuses_a_bad_url(client, tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    client.force_login(admin)

    response = client.post(
        reverse("notifications:webhook", args=["acme", endpoint.pk]),
        {"url": "gopher://x.example/", "events": ["run.completed"]},
    )

    assert response.status_code == 400
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).url == endpoint.url


def test_webhook_delete_removes_it_with_its_log_and_is_audited(client, tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    failed_delivery(tenant, endpoint)
    client.force_login(admin)

    response = client.post(reverse("notifications:delete", args=["acme", endpoint.pk]))

    assert response.status_code == 302
    assert WebhookEndpoint.objects.count() == 0
    assert Delivery.objects.count() == 0
    assert AuditEvent.objects.filter(action="webhook.deleted").count() == 1


def test_webhook_post_only_views_refuse_get(client, tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    delivery = failed_delivery(tenant, endpoint)
    client.force_login(admin)

    assert client.get(reverse("notifications:delete", args=["acme", endpoint.pk])).status_code == (
        405
    )
    assert client.get(reverse("notifications:retry", args=["acme", delivery.pk])).status_code == (
        405
    )
    assert WebhookEndpoint.objects.count() == 1


def test_delivery_log_shows_status_attempts_error_and_a_retry_button(client, tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    delivery = failed_delivery(tenant, endpoint)
    client.force_login(admin)

    response = client.get(reverse("notifications:deliveries", args=["acme"]))

    page = response.content.decode()
    assert response.status_code == 200
    assert f'data-delivery="{delivery.pk}" data-status="failed"' in page
    assert "HTTP 500" in page
    assert reverse("notifications:retry", args=["acme", delivery.pk]) in page
    # run.failed without a run links to the queue, as its payload says.
    assert '<a href="http://127.0.0.1:8000/"><code>run.failed</code></a>' in page


def test_delivery_log_filters_by_endpoint_and_pages(client, tenant, admin, monkeypatch):
    from notifications import views

    monkeypatch.setattr(views, "DELIVERY_PAGE", 2)
    first, _ = make_endpoint(tenant, admin)
    second, _ = make_endpoint(tenant, admin, url="https://second.example/")
    for _ in range(3):
        with transaction.atomic():
            event = audit.append(tenant_id=tenant.pk, action="run.completed", actor_name="w")
        fan_out.fan_out(audit_event=event)
    client.force_login(admin)
    url = reverse("notifications:deliveries", args=["acme"])

    page1 = client.get(url, {"endpoint": second.pk})
    cursor = page1.context["page"].next_cursor
    page2 = client.get(url, {"endpoint": second.pk, "after": cursor})

    rows = [d.endpoint_id for d in page1.context["page"].rows + page2.context["page"].rows]
    assert rows == [second.pk] * 3
    assert page2.context["page"].next_cursor is None
    assert client.get(url, {"after": "broken!"}).status_code == 400
    assert client.get(url, {"status": "nonsense"}).status_code == 400


def test_delivery_retry_resets_enqueues_and_audits(client, tenant, admin):
    endpoint, _ = make_endpoint(tenant, admin)
    delivery = failed_delivery(tenant, endpoint)
    client.force_login(admin)

    response = client.post(reverse("notifications:retry", args=["acme", delivery.pk]))
    twice = client.post(reverse("notifications:retry", args=["acme", delivery.pk]))

    delivery.refresh_from_db()
    assert response.status_code == 302 and twice.status_code == 302
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.PENDING, 0)
    assert DBTaskResult.objects.filter(task_path=DELIVER_TASK).count() == 1
    retried = AuditEvent.objects.get(action="webhook.retried")
    assert (retried.actor_id, retried.detail["delivery"]) == (admin.pk, delivery.pk)


def test_delivery_log_queries_do_not_grow_with_rows(client, tenant, admin):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    endpoint, _ = make_endpoint(tenant, admin)
    client.force_login(admin)
    url = reverse("notifications:deliveries", args=["acme"])
    counts = []
    for _ in range(2):
        failed_delivery(tenant, endpoint)
        failed_delivery(tenant, endpoint)
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        counts.append(len(queries))

    assert counts[0] == counts[1]
