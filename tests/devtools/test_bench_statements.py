"""The bench's statement counter and its silent webhook receiver."""

from __future__ import annotations

import socket
import threading

import pytest

from approvals.models import Tenant
from devtools.bench import queries, silent
from notifications.models import WebhookEndpoint
from tests.support import TenantFactory, member


@pytest.mark.django_db(transaction=True)
def test_counting_tells_the_calling_thread_from_the_others():
    TenantFactory(slug="acme")

    def other_thread():
        from django.db import connection

        list(Tenant.objects.all())
        list(Tenant.objects.all())
        connection.close()

    with queries.counting() as counts:
        list(Tenant.objects.all())
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()

    assert (counts["main"], counts["other"]) == (1, 2)
    assert [name for name, _ in counts.log].count("MainThread") == 1
    # Outside the block nothing is counted any more.
    list(Tenant.objects.all())
    assert counts["main"] == 1


@pytest.mark.django_db(transaction=True)
def test_per_call_averages_over_the_calls():
    TenantFactory(slug="acme")

    figures = queries.per_call([lambda: list(Tenant.objects.all())] * 4)

    assert figures == {
        "statements": 1.0,
        "main_thread": 1.0,
        "other_threads": 0.0,
        "commits": 0.0,
        "calls": 4,
    }


@pytest.mark.django_db
def test_the_silent_receiver_holds_connections_and_never_answers():
    tenant = TenantFactory(slug="acme")
    receiver = silent.SilentReceiver()
    try:
        receiver.subscribe(tenant, member(tenant, username="admin"))
        endpoint = WebhookEndpoint.objects.get(tenant=tenant)
        assert endpoint.url == receiver.url and endpoint.active
        port = int(receiver.url.rsplit(":", 1)[1].split("/")[0])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"POST /hook HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            conn.settimeout(0.2)
            with pytest.raises(TimeoutError):
                conn.recv(1)
        receiver.unsubscribe(tenant)
        assert not WebhookEndpoint.objects.filter(tenant=tenant).exists()
    finally:
        receiver.close()
