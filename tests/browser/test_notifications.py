"""The delivery log in a real browser: deliveries appear and change status live, and a test
event sent from the webhook's page reports what the receiver answered."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from approvals.audit import chain as audit
from approvals.models import AuditEvent
from notifications import deliveries
from notifications.models import Delivery, DeliveryStatus
from tests.browser.conftest import chromium_skip_reason, new_page, screenshot
from tests.browser.test_console import (
    _assert_not_reloaded,
    _mark_loaded,
    _sign_in,
    _wait_live,
    expect,
)
from tests.notifications.conftest import fan_out_committed, make_endpoint
from tests.support import TenantFactory, member

pytestmark = [
    pytest.mark.skipif(bool(chromium_skip_reason()), reason=chromium_skip_reason() or "-"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]


def _in_thread(work):
    """Run database work outside Playwright's event loop, as another process of ours would."""
    result = {}

    def target():
        try:
            result["value"] = work()
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=60)
    assert "value" in result, "the work in the thread failed"
    return result["value"]


def _fail_a_run(tenant) -> Delivery:
    # The notifications pool's fan-out of the event: one delivery for the webhook. In the same
    # transaction as the event here, so that the page hears of the change only once the row it
    # must show exists: with the in-memory layer (no Redis) the web process learns of changes by
    # tailing the audit log, and a pending delivery writes no event of its own, so a page that
    # re-read between the event's commit and the fan-out's would wait for a hint that never came.
    with transaction.atomic():
        event = audit.append(tenant_id=tenant.pk, action="run.failed", actor_name="worker")
        fan_out_committed()
    return Delivery.objects.get(audit_event_id=event.pk)


def test_delivery_log_is_live_and_a_test_event_reports_the_answer(
    console_browser, live_server_only, receiver
):
    tenant = TenantFactory(slug="acme", name="Acme")
    admin = member(tenant, "admin", username="ops-admin")
    endpoint, secret = make_endpoint(tenant, admin, url=receiver.url)
    receiver.secrets.append(secret)

    with console_browser() as browser:
        page = new_page(browser, live_server_only)
        _sign_in(page, admin.username)
        page.goto("/notifications/acme/deliveries/")
        expect(page.locator("#delivery-rows .empty-title")).to_have_text("No deliveries yet.")
        _wait_live(page)
        _mark_loaded(page)

        # A run fails: its delivery row appears pending, then turns delivered, without a reload.
        delivery = _in_thread(lambda: _fail_a_run(tenant))
        row = page.locator(f'#deliveries tr[data-delivery="{delivery.pk}"]')
        expect(row).to_have_attribute("data-status", "pending")
        _in_thread(lambda: deliveries.attempt(delivery.pk))
        expect(row).to_have_attribute("data-status", "delivered")
        expect(row).to_contain_text("HTTP 204")
        _assert_not_reloaded(page)
        screenshot(page, "notifications-1-delivery-log-live")

        page.goto(f"/notifications/acme/webhooks/{endpoint.pk}/")
        page.click("#ping-webhook")
        expect(page.locator(".flash")).to_contain_text(
            f"Test event delivered to webhook {endpoint.pk}: HTTP 204 in"
        )
        screenshot(page, "notifications-2-test-event")

    assert [r.verified for r in receiver.received] == [True, True]
    assert Delivery.objects.get().status == DeliveryStatus.DELIVERED
    assert AuditEvent.objects.filter(action="webhook.pinged", outcome="delivered").count() == 1
