"""The live channel: only signed-in members connect, and each hears only its own tenants."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.models import Session
from django.db import connection, transaction

from approvals.audit import chain as audit
from approvals.decisions import claims
from approvals.decisions.decide import decide
from approvals.live import hints, tail
from approvals.live.consumers import SIGNED_OUT_CODE, ConsoleConsumer
from approvals.models import Membership, Role, Ticket
from tests.support import (
    ORIGIN,
    SOCKET_PATH,
    TenantFactory,
    decision_hints,
    member,
    pending_ticket,
    session_cookie,
    socket,
)


@pytest.fixture(autouse=True)
def _fresh_tail(settings, monkeypatch):
    """A quick poll, and a tail of this test's own: a task left by another loop never delivers."""
    settings.APPROVALS_LIVE_POLL_SECONDS = 0.05
    monkeypatch.setattr(tail, "audit_tail", tail.AuditTail())


def approve(ticket: Ticket, approver) -> None:
    decide(ticket, user=approver, approve=True)


@pytest.mark.django_db(transaction=True)
def test_consumer_refuses_an_anonymous_socket():
    async def scenario():
        communicator = socket(ORIGIN)
        connected, code = await communicator.connect()
        await communicator.disconnect()
        return connected, code

    assert async_to_sync(scenario)() == (False, 4401)


@pytest.mark.django_db(transaction=True)
def test_consumer_refuses_a_foreign_origin_even_when_signed_in():
    cookie = session_cookie(member(TenantFactory(), Role.ADMIN))

    async def scenario():
        communicator = socket((b"origin", b"http://evil.example"), cookie)
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    assert async_to_sync(scenario)() is False


@pytest.mark.django_db(transaction=True)
def test_consumer_refuses_an_inactive_user():
    user = member(TenantFactory(), Role.ADMIN)
    user.is_active = False
    user.save(update_fields=["is_active"])

    async def scenario():
        communicator = WebsocketCommunicator(ConsoleConsumer.as_asgi(), SOCKET_PATH)
        communicator.scope["user"] = user
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    assert async_to_sync(scenario)() is False


@pytest.mark.django_db(transaction=True)
def test_consumer_accepts_a_signed_in_member():
    cookie = session_cookie(member(TenantFactory(), Role.VIEWER))

    async def scenario():
        communicator = socket(ORIGIN, cookie)
        connected, _ = await communicator.connect()
        await communicator.send_to(text_data="ignored")
        quiet = await communicator.receive_nothing(timeout=0.2)
        await communicator.disconnect()
        return connected, quiet

    assert async_to_sync(scenario)() == (True, True)


@pytest.mark.django_db(transaction=True)
def test_consumer_hints_a_member_about_its_tenants_decision():
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    approver = member(tenant, Role.APPROVER)
    cookie = session_cookie(member(tenant, Role.VIEWER))

    async def scenario():
        await get_channel_layer().flush()
        communicator = socket(ORIGIN, cookie)
        connected, _ = await communicator.connect()
        assert connected
        try:
            await database_sync_to_async(approve)(ticket, approver)
            return await decision_hints(communicator)
        finally:
            await communicator.disconnect()

    heard = async_to_sync(scenario)()
    decided, queued = heard["ticket.decided"], heard["run.changed"]

    assert decided == (
        '<div id="live-hint" class="visually-hidden" aria-live="polite" hx-swap-oob="true" '
        f'data-kind="ticket.decided" data-run="{ticket.run_id}" data-ticket="{ticket.pk}">'
        f"Ticket #{ticket.pk} was approved.</div>\n"
    )
    assert f'data-kind="run.changed" data-run="{ticket.run_id}"' in queued
    assert f"Run #{ticket.run_id} is now queued." in queued


@pytest.mark.django_db(transaction=True)
def test_consumer_sends_nothing_about_another_tenant():
    mine, theirs = TenantFactory(), TenantFactory()
    their_ticket = pending_ticket(theirs, requested_by=member(theirs, Role.VIEWER))
    their_approver = member(theirs, Role.APPROVER)
    my_ticket = pending_ticket(mine, requested_by=member(mine, Role.VIEWER))
    my_approver = member(mine, Role.APPROVER)
    cookie = session_cookie(member(mine, Role.ADMIN))

    async def scenario():
        await get_channel_layer().flush()
        communicator = socket(ORIGIN, cookie)
        connected, _ = await communicator.connect()
        assert connected
        try:
            await database_sync_to_async(approve)(their_ticket, their_approver)
            quiet = await communicator.receive_nothing(timeout=0.5)
            # Then one of our own: the next hints to arrive must be about it.
            await database_sync_to_async(approve)(my_ticket, my_approver)
            heard = await decision_hints(communicator)
            quiet_after = await communicator.receive_nothing(timeout=0.3)
            return quiet, heard, quiet_after
        finally:
            await communicator.disconnect()

    quiet, heard, quiet_after = async_to_sync(scenario)()

    assert quiet is True
    assert f'data-ticket="{my_ticket.pk}"' in heard["ticket.decided"]
    assert f'data-run="{my_ticket.run_id}"' in heard["run.changed"]
    assert quiet_after is True
    assert f"Ticket #{their_ticket.pk} " not in "".join(heard.values())


@pytest.mark.django_db(transaction=True)
def test_consumer_hints_a_member_about_a_claim_on_its_tenants_ticket():
    tenant = TenantFactory()
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    alice = member(tenant, Role.APPROVER, username="alice")
    cookie = session_cookie(member(tenant, Role.VIEWER))

    async def scenario():
        await get_channel_layer().flush()
        communicator = socket(ORIGIN, cookie)
        connected, _ = await communicator.connect()
        assert connected
        try:
            await database_sync_to_async(lambda: claims.claim(ticket, user=alice))()
            return await communicator.receive_from(timeout=5)
        finally:
            await communicator.disconnect()

    claimed = async_to_sync(scenario)()

    assert claimed == (
        '<div id="live-hint" class="visually-hidden" aria-live="polite" hx-swap-oob="true" '
        f'data-kind="ticket.changed" data-run="{ticket.run_id}" data-ticket="{ticket.pk}">'
        f"Ticket #{ticket.pk} changed.</div>\n"
    )


@pytest.mark.django_db(transaction=True)
def test_consumer_stops_hearing_a_tenant_as_soon_as_the_membership_is_deleted():
    left, kept = TenantFactory(), TenantFactory()
    user = member(left, Role.VIEWER, username="leaver")
    member(kept, Role.VIEWER, username="leaver")
    requester = member(left, Role.VIEWER)
    before, after = (pending_ticket(left, requested_by=requester) for _ in range(2))
    approver = member(left, Role.APPROVER)
    kept_ticket = pending_ticket(kept, requested_by=member(kept, Role.VIEWER))
    kept_approver = member(kept, Role.APPROVER)
    cookie = session_cookie(user)

    async def scenario():
        await get_channel_layer().flush()
        communicator = socket(ORIGIN, cookie)
        connected, _ = await communicator.connect()
        assert connected
        try:
            await database_sync_to_async(approve)(before, approver)
            heard = await decision_hints(communicator)
            await database_sync_to_async(
                lambda: Membership.objects.filter(user=user, tenant=left).delete()
            )()
            await database_sync_to_async(approve)(after, approver)
            quiet = await communicator.receive_nothing(timeout=0.5)
            await database_sync_to_async(approve)(kept_ticket, kept_approver)
            still = await decision_hints(communicator)
            return heard, quiet, still
        finally:
            await communicator.disconnect()

    heard, quiet, still = async_to_sync(scenario)()

    assert f'data-ticket="{before.pk}"' in heard["ticket.decided"]
    assert f'data-run="{before.run_id}"' in heard["run.changed"]
    assert quiet is True
    assert f'data-ticket="{kept_ticket.pk}"' in still["ticket.decided"]
    assert f'data-run="{kept_ticket.run_id}"' in still["run.changed"]


def delivery_changed(tenant) -> None:
    """A delivery changed: the hint the tenant's admins hear, in either deployment mode."""
    with transaction.atomic():
        audit.append(tenant_id=tenant.pk, action="webhook.delivered", actor_name="notifier")
        hints.notify_admins_on_commit(tenant.pk, status="delivered")


@pytest.mark.django_db(transaction=True)
def test_consumer_stops_hearing_the_admins_hints_once_the_admin_is_downgraded():
    tenant = TenantFactory()
    admin = member(tenant, Role.ADMIN)
    ticket = pending_ticket(tenant, requested_by=member(tenant, Role.VIEWER))
    approver = member(tenant, Role.APPROVER)
    cookie = session_cookie(admin)

    async def scenario():
        await get_channel_layer().flush()
        communicator = socket(ORIGIN, cookie)
        connected, _ = await communicator.connect()
        assert connected
        try:
            await database_sync_to_async(delivery_changed)(tenant)
            heard = await communicator.receive_from(timeout=5)
            await database_sync_to_async(
                lambda: Membership.objects.update_or_create(
                    user=admin, tenant=tenant, defaults={"role": Role.APPROVER}
                )
            )()
            await database_sync_to_async(delivery_changed)(tenant)
            quiet = await communicator.receive_nothing(timeout=0.5)
            await database_sync_to_async(approve)(ticket, approver)
            still = await decision_hints(communicator)
            return heard, quiet, still
        finally:
            await communicator.disconnect()

    heard, quiet, still = async_to_sync(scenario)()

    assert 'data-kind="delivery.changed"' in heard
    assert quiet is True
    assert f'data-ticket="{ticket.pk}"' in still["ticket.decided"]


# --- what a socket finds out on its own, when a message about it was lost ---------------------


@pytest.mark.django_db(transaction=True)
def test_a_socket_whose_session_ended_without_a_word_closes_at_its_next_recheck(settings):
    settings.APPROVALS_LIVE_RECHECK_SECONDS = 0.05
    cookie = session_cookie(member(TenantFactory(), Role.VIEWER))

    async def scenario():
        await get_channel_layer().flush()
        communicator = socket(ORIGIN, cookie)
        connected, _ = await communicator.connect()
        assert connected
        try:
            # The session goes, and no message says so (as if it were lost).
            await database_sync_to_async(lambda: Session.objects.all().delete())()
            return await communicator.receive_output(timeout=5)
        finally:
            await communicator.disconnect()

    assert async_to_sync(scenario)() == {"type": "websocket.close", "code": SIGNED_OUT_CODE}


@pytest.mark.django_db(transaction=True)
def test_a_socket_whose_membership_ended_without_a_word_stops_hearing_at_its_next_recheck(
    settings,
):
    settings.APPROVALS_LIVE_RECHECK_SECONDS = 0.05
    tenant = TenantFactory()
    user = member(tenant, Role.VIEWER, username="leaver")
    requester, approver = member(tenant, Role.VIEWER), member(tenant, Role.APPROVER)
    tickets = [pending_ticket(tenant, requested_by=requester) for _ in range(6)]
    cookie = session_cookie(user)

    def leave_silently() -> None:
        # No signal, so no membership message: as if it were lost. (With the in-memory layer
        # the audit tail reads memberships on its own as well; with Redis only the recheck does.)
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {Membership._meta.db_table} WHERE user_id = %s", [user.pk])

    async def scenario():
        await get_channel_layer().flush()
        communicator = socket(ORIGIN, cookie)
        connected, _ = await communicator.connect()
        assert connected
        try:
            await database_sync_to_async(approve)(tickets[0], approver)
            heard = await decision_hints(communicator)
            await database_sync_to_async(leave_silently)()
            # Each later decision is heard until the socket's recheck finds the membership gone.
            for ticket in tickets[1:]:
                await database_sync_to_async(approve)(ticket, approver)
                if await communicator.receive_nothing(timeout=0.5):
                    return heard, True
                # Heard: both hints, or one when the recheck came between them.
                while not await communicator.receive_nothing(timeout=0.2):
                    await communicator.receive_from(timeout=5)
            return heard, False
        finally:
            await communicator.disconnect()

    heard, went_quiet = async_to_sync(scenario)()

    assert f'data-ticket="{tickets[0].pk}"' in heard["ticket.decided"]
    assert went_quiet is True
