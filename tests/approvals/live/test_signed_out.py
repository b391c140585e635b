"""A member removed (or whose sessions end) loses their open websocket within a second, with the
in-memory layer (the audit tail tells the socket) and with Redis (the change's own message);
the socket of a session that was kept stays open."""

from __future__ import annotations

import uuid

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from approvals import signins, tenancy
from approvals.live import hints, tail
from approvals.live.consumers import SIGNED_OUT_CODE
from approvals.models import Role
from tests.support import (
    ORIGIN,
    TenantFactory,
    cookie_of,
    hints_settled,
    member,
    signed_in,
    socket,
)

REDIS_TEST_URL = "redis://127.0.0.1:6379/14"

pytestmark = pytest.mark.django_db(transaction=True)


def _redis_answers() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_TEST_URL, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(params=["in-memory", "redis"])
def layer(request, settings, monkeypatch):
    """Each test runs on both layers; the in-memory tail polls at the console's own interval."""
    monkeypatch.setattr(tail, "audit_tail", tail.AuditTail())
    if request.param == "redis":
        if not _redis_answers():
            pytest.skip(f"no Redis at {REDIS_TEST_URL}")
        settings.CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                "CONFIG": {
                    "hosts": [REDIS_TEST_URL],
                    "prefix": f"test-signed-out:{uuid.uuid4().hex}",
                },
            }
        }
        monkeypatch.setattr(hints, "_sender", hints._SenderLoop())
    return request.param


async def _closed_within_a_second(communicator) -> dict:
    """The socket's close, waited for at most one second (live hints before it are skipped)."""
    while True:
        output = await communicator.receive_output(timeout=1)
        if output["type"] == "websocket.close":
            return output


async def _closes(communicator) -> list[dict]:
    """What the socket sent in the next moment that was not a hint: nothing, if it stays open."""
    sent = []
    while not await communicator.receive_nothing(timeout=0.3):
        sent.append(await communicator.receive_output())
    return [output for output in sent if output["type"] != "websocket.send"]


def test_removed_member_socket_closes_within_a_second(layer):
    tenant = TenantFactory()
    admin = member(tenant, Role.ADMIN, username="root")
    leaver = member(tenant, Role.APPROVER, username="leaver")
    leavers, admins = signed_in(leaver), signed_in(admin)

    async def scenario():
        await get_channel_layer().flush()
        gone, kept = socket(ORIGIN, cookie_of(leavers)), socket(ORIGIN, cookie_of(admins))
        assert (await gone.connect())[0] and (await kept.connect())[0]
        try:
            await database_sync_to_async(tenancy.remove_member)(
                tenant=tenant, user=leaver, actor=admin
            )
            closed = await _closed_within_a_second(gone)
            quiet = await _closes(kept)
            return closed, quiet
        finally:
            await hints_settled()
            await gone.disconnect()
            await kept.disconnect()

    closed, quiet = async_to_sync(scenario)()

    assert closed == {"type": "websocket.close", "code": SIGNED_OUT_CODE}
    assert quiet == []


def test_signing_out_the_other_sessions_keeps_this_sessions_socket(layer):
    tenant = TenantFactory()
    user = member(tenant, Role.VIEWER, username="ana")
    here, there = signed_in(user), signed_in(user)

    async def scenario():
        await get_channel_layer().flush()
        kept, gone = socket(ORIGIN, cookie_of(here)), socket(ORIGIN, cookie_of(there))
        assert (await kept.connect())[0] and (await gone.connect())[0]
        try:
            await database_sync_to_async(signins.end_sessions)(
                user=user,
                keep_session_key=here.session.session_key,
                reason="signed out the other sessions",
                actor=user,
            )
            closed = await _closed_within_a_second(gone)
            quiet = await _closes(kept)
            return closed, quiet
        finally:
            await hints_settled()
            await kept.disconnect()
            await gone.disconnect()

    closed, quiet = async_to_sync(scenario)()

    assert closed == {"type": "websocket.close", "code": SIGNED_OUT_CODE}
    assert quiet == []


def test_a_signed_out_session_cannot_open_a_socket_again(layer):
    tenant = TenantFactory()
    user = member(tenant, Role.VIEWER)
    client = signed_in(user)
    signins.end_sessions(user=user, reason="test")

    async def scenario():
        communicator = socket(ORIGIN, cookie_of(client))
        connected, code = await communicator.connect()
        await communicator.disconnect()
        return connected, code

    assert async_to_sync(scenario)() == (False, SIGNED_OUT_CODE)
