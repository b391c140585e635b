from __future__ import annotations

import pytest

from approvals.models import Role, Tenant
from notifications import endpoints, fan_out
from notifications.models import Event, FanOutCursor, WebhookEndpoint
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


def fan_out_committed() -> int:
    """What the worker's notifications pool does before each task it claims: fan out the audit
    events committed since its last pass (never the process that committed them)."""
    return fan_out.catch_up()


def caught_up(tenant: Tenant) -> None:
    """The worker's fan-out is past the tenant's events so far (a test's set-up), so what the
    test then fans out is its own action's notifications alone."""
    tenant.refresh_from_db(fields=["audit_seq"])
    FanOutCursor.objects.update_or_create(tenant=tenant, defaults={"seq": tenant.audit_seq})
