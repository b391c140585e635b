from __future__ import annotations

import pytest

from approvals.models import Role, Tenant
from notifications import endpoints
from notifications.models import Event, WebhookEndpoint
from tests.support import TenantFactory, member


@pytest.fixture
def tenant() -> Tenant:
    return TenantFactory(slug="acme", name="Acme Corp")


@pytest.fixture
def admin(tenant):
    return member(tenant, Role.ADMIN, username="acme-admin")


def make_endpoint(
    tenant: Tenant, admin, url: str = "http://127.0.0.1:9/hook", events=None, active=True
) -> tuple[WebhookEndpoint, str]:
    return endpoints.create_endpoint(
        tenant=tenant,
        user=admin,
        url=url,
        description="test",
        events=list(Event.values) if events is None else events,
        active=active,
    )
