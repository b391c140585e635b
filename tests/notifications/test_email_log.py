"""The email log: admins of the tenant only; rows with status and attempts; the manual retry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django_tasks_db.models import DBTaskResult

from approvals.audit import chain as audit
from approvals.models import AuditEvent, Role
from notifications import emails, events
from notifications.models import DeliveryStatus, EmailDelivery
from tests.support import TenantFactory, member

pytestmark = pytest.mark.django_db

EMAIL_TASK = "notifications.emails.deliver_email_task"


def log_url(slug="acme") -> str:
    return reverse("notifications:emails", args=[slug])


def retry_url(email, slug="acme") -> str:
    return reverse("notifications:email_retry", args=[slug, email.pk])


def email_row(tenant, to="ann@example.com", **fields) -> EmailDelivery:
    """A recorded email about a run.failed event, as fan_out writes it, then changed by fields."""
    with transaction.atomic():
        event = audit.append(tenant_id=tenant.pk, action="run.failed", actor_name="worker")
    facts = events.facts_for(event, "run.failed")
    subject, body = emails.email_for(facts)
    now = timezone.now()
    values = {"next_attempt_at": now, "created_at": now, "updated_at": now, **fields}
    return EmailDelivery.objects.create(
        tenant=tenant,
        audit_event_id=event.pk,
        event="run.failed",
        recipient=to,
        subject=subject,
        body=body,
        **values,
    )


def failed_email(tenant, to="ann@example.com") -> EmailDelivery:
    return email_row(
        tenant,
        to=to,
        status=DeliveryStatus.FAILED,
        attempts=5,
        next_attempt_at=None,
        last_error="SMTPServerDisconnected: Connection unexpectedly closed",
    )


def test_email_log_shows_rows_status_error_and_a_retry_button_for_failed_ones(
    client, tenant, admin
):
    failed = failed_email(tenant)
    sent = email_row(
        tenant,
        to="bob@example.com",
        status=DeliveryStatus.DELIVERED,
        attempts=1,
        delivered_at=timezone.now(),
    )
    waiting = email_row(
        tenant, to="vic@example.com", attempts=2, last_error="SMTPDataError: (451, b'later')"
    )
    client.force_login(admin)

    response = client.get(log_url())

    page = response.content.decode()
    assert response.status_code == 200
    assert [e.pk for e in response.context["page"].rows] == [waiting.pk, sent.pk, failed.pk]
    assert f'data-email="{failed.pk}" data-status="failed"' in page
    assert f'data-email="{sent.pk}" data-status="delivered"' in page
    assert f'data-email="{waiting.pk}" data-status="pending"' in page
    assert "SMTPServerDisconnected: Connection unexpectedly closed" in page
    assert "bob@example.com" in page and "[Acme Corp] Run changed: run None" in page
    # Retry for the failed email only.
    assert retry_url(failed) in page
    assert retry_url(sent) not in page and retry_url(waiting) not in page
    # run.failed without a run links to the queue, as the email said.
    assert '<a href="http://127.0.0.1:8000/"><code>run.failed</code></a>' in page
    # The tab is there on every notifications page.
    webhooks = client.get(reverse("notifications:webhooks", args=["acme"])).content.decode()
    assert f'href="{log_url()}"' in webhooks


def test_email_log_filters_by_status_and_pages(client, tenant, admin, monkeypatch):
    from notifications import views

    monkeypatch.setattr(views, "EMAIL_PAGE", 2)
    failed = [failed_email(tenant, to=f"f{i}@example.com") for i in range(3)]
    email_row(tenant, to="pending@example.com")
    client.force_login(admin)

    page1 = client.get(log_url(), {"status": "failed"})
    page2 = client.get(log_url(), {"status": "failed", "after": page1.context["page"].next_cursor})

    rows = page1.context["page"].rows + page2.context["page"].rows
    assert [e.pk for e in rows] == [e.pk for e in reversed(failed)]
    assert page2.context["page"].next_cursor is None
    assert "status=failed" in page1.context["next_query"]
    assert client.get(log_url(), {"status": "nonsense"}).status_code == 400
    assert client.get(log_url(), {"after": "broken!"}).status_code == 400


def test_email_log_empty(client, tenant, admin):
    client.force_login(admin)

    response = client.get(log_url())

    assert response.status_code == 200
    assert "No emails yet." in response.content.decode()


@pytest.mark.parametrize("role", [Role.VIEWER, Role.APPROVER, Role.AUDITOR])
def test_email_log_and_retry_are_404_for_non_admins(client, tenant, role):
    email = failed_email(tenant)
    client.force_login(member(tenant, role))

    statuses = [client.get(log_url()).status_code, client.post(retry_url(email)).status_code]

    assert statuses == [404, 404]
    assert EmailDelivery.objects.get(pk=email.pk).status == DeliveryStatus.FAILED
    assert not AuditEvent.objects.filter(action="email.retried").exists()


def test_email_log_another_tenants_emails_are_404_even_under_ones_own_slug(client, tenant, admin):
    other = TenantFactory(slug="globex")
    theirs = failed_email(other, to="someone@globex.example")
    failed_email(tenant)
    client.force_login(admin)

    statuses = [
        client.get(log_url("globex")).status_code,
        client.post(retry_url(theirs, "globex")).status_code,
        client.post(retry_url(theirs, "acme")).status_code,
    ]
    page = client.get(log_url()).content.decode()

    assert statuses == [404, 404, 404]
    assert "globex.example" not in page
    assert EmailDelivery.objects.get(pk=theirs.pk).status == DeliveryStatus.FAILED


def test_email_retry_resets_enqueues_and_audits_once(client, tenant, admin):
    email = failed_email(tenant)
    client.force_login(admin)

    response = client.post(retry_url(email))
    twice = client.post(retry_url(email), follow=True)

    email.refresh_from_db()
    assert response.status_code == 302 and response.url == log_url()
    assert twice.status_code == 200
    assert f"Email {email.pk} was not retried: only a failed email can be retried." in (
        twice.content.decode()
    )
    assert (email.status, email.attempts) == (DeliveryStatus.PENDING, 0)
    assert [t.args_kwargs["args"] for t in DBTaskResult.objects.filter(task_path=EMAIL_TASK)] == [
        [email.pk]
    ]
    retried = AuditEvent.objects.get(action="email.retried")
    assert (retried.actor_id, retried.detail["delivery"]) == (admin.pk, email.pk)
    assert retried.detail["recipient"] == "a***@example.com"


@pytest.mark.parametrize("status", [DeliveryStatus.DELIVERED, DeliveryStatus.PENDING])
def test_email_retry_of_an_email_that_did_not_fail_is_refused(client, tenant, admin, status):
    email = email_row(tenant, status=status, attempts=1)
    client.force_login(admin)

    response = client.post(retry_url(email), follow=True)

    assert response.status_code == 200
    assert f"Email {email.pk} was not retried" in response.content.decode()
    email.refresh_from_db()
    assert (email.status, email.attempts) == (status, 1)
    assert not DBTaskResult.objects.filter(task_path=EMAIL_TASK).exists()
    assert not AuditEvent.objects.filter(action="email.retried").exists()


def test_email_retry_refuses_get(client, tenant, admin):
    email = failed_email(tenant)
    client.force_login(admin)

    assert client.get(retry_url(email)).status_code == 405


def test_email_log_queries_do_not_grow_with_rows(client, tenant, admin):
    client.force_login(admin)
    counts = []
    for _ in range(2):
        failed_email(tenant)
        email_row(tenant, to="bob@example.com", next_attempt_at=timezone.now() + timedelta(10))
        with CaptureQueriesContext(connection) as queries:
            assert client.get(log_url()).status_code == 200
        counts.append(len(queries))

    assert counts[0] == counts[1]
