"""What an appended audit event holds, whom it is said to, and the time it hashes."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from django.db import transaction

from approvals import signals
from approvals.audit import chain
from approvals.models import AuditEvent, Ticket
from tests.support import TenantFactory, paused_run

pytestmark = pytest.mark.django_db


def test_append_for_ticket_records_the_ticket_and_what_it_is_given_only():
    tenant = TenantFactory()
    ticket = Ticket.objects.get(run=paused_run(tenant))

    with transaction.atomic():
        event = chain.append_for_ticket(ticket, action="ticket.created", actor_name="worker w1")

    stored = AuditEvent.objects.filter(pk=event.pk).values(
        "tenant_id", "run_id", "ticket_id", "tool_name", "arguments_digest", "actor_name"
    )
    assert stored.get() == {
        "tenant_id": tenant.pk,
        "run_id": ticket.run_id,
        "ticket_id": ticket.pk,
        "tool_name": "deploy_release",
        "arguments_digest": ticket.arguments_digest,
        "actor_name": "worker w1",
    }
    assert AuditEvent.objects.get(pk=event.pk).outcome == ""


def test_append_of_an_event_about_no_ticket_leaves_the_ticket_fields_empty():
    tenant = TenantFactory()

    with transaction.atomic():
        event = chain.append(tenant_id=tenant.pk, action="run.paused")

    stored = AuditEvent.objects.filter(pk=event.pk)
    assert stored.values_list("tool_name", "arguments_digest", "ticket_id").get() == ("", "", None)


def test_append_says_the_event_committed_once_after_the_commit(django_capture_on_commit_callbacks):
    tenant = TenantFactory()
    heard: list[tuple[object, object]] = []

    def listen(sender, event, **_):
        heard.append((sender, event))

    signals.audit_event_committed.connect(listen)
    try:
        with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
            event = chain.append(tenant_id=tenant.pk, action="run.paused")
            assert heard == []
    finally:
        signals.audit_event_committed.disconnect(listen)

    assert heard == [(AuditEvent, event)]


def test_the_hashed_time_is_utc_whatever_the_process_time_zone(monkeypatch):
    """Two processes in two time zones must hash the same event the same way."""
    event = AuditEvent(tenant_id=1, seq=1, action="run.paused")
    event.created_at = datetime(2026, 12, 4, 16, 45, 0, 123456, tzinfo=UTC)
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        payload = chain._event_payload(event)
    finally:
        monkeypatch.undo()
        time.tzset()

    assert '"created_at":"2026-12-04T16:45:00.123456+00:00"' in payload
