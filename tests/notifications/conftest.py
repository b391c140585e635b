from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from approvals.models import Role, Tenant
from notifications import services
from notifications.management.commands.webhook_receiver import make_server
from notifications.models import Event, WebhookEndpoint
from tests.factories import TenantFactory, member


@dataclass
class Received:
    line: str
    verified: bool
    body: bytes


@dataclass
class Receiver:
    """A real HTTP receiver on 127.0.0.1 that verifies signatures with the given secrets."""

    url: str
    secrets: list[str]
    received: list[Received] = field(default_factory=list)

    @property
    def verified(self) -> list[Received]:
        return [r for r in self.received if r.verified]


def _serve(status: int):
    receiver = Receiver(url="", secrets=[])
    server = make_server(
        "127.0.0.1",
        0,
        lambda: list(receiver.secrets),
        lambda line, ok, body: receiver.received.append(Received(line, ok, body)),
        status=status,
    )
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread, receiver


@pytest.fixture
def receiver():
    server, thread, found = _serve(204)
    yield found
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def failing_receiver():
    """Verifies the signature, then answers 500 every time."""
    server, thread, found = _serve(500)
    yield found
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def tenant() -> Tenant:
    return TenantFactory(slug="acme", name="Acme Corp")


@pytest.fixture
def admin(tenant):
    return member(tenant, Role.ADMIN, username="acme-admin")


def make_endpoint(
    tenant: Tenant, admin, url: str = "http://127.0.0.1:9/hook", events=None, active=True
) -> tuple[WebhookEndpoint, str]:
    return services.create_endpoint(
        tenant=tenant,
        user=admin,
        url=url,
        description="test",
        events=list(Event.values) if events is None else events,
        active=active,
    )
