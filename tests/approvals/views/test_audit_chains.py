"""Long hash chains are verified after the audit page has shown the history, not before."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import transaction
from django.urls import reverse

from approvals.audit import chain as audit
from approvals.audit import history
from approvals.models import Role
from approvals.views import audit as audit_views
from tests.support import TenantFactory, member

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_chain_cache():
    cache.clear()
    yield
    cache.clear()


def _history(tenant, events: int) -> None:
    for _ in range(events):
        with transaction.atomic():
            audit.append(tenant_id=tenant.pk, action="ticket.created", actor_name="seed")


def test_audit_page_defers_a_long_chain_to_the_chains_fragment(client, monkeypatch):
    monkeypatch.setattr(audit_views, "CHAIN_INLINE_EVENTS", 2)
    tenant = TenantFactory(slug="acme")
    _history(tenant, 3)
    client.force_login(member(tenant, Role.AUDITOR))

    page = client.get(reverse("approvals:audit")).content.decode()
    chains = client.get(reverse("approvals:audit-chains"))

    assert "Verifying the hash chains" in page
    assert "chain verified" not in page
    assert chains.status_code == 200
    assert "✓ acme: chain verified" in chains.content.decode()
    # Now cached for this chain head: the page shows it at once.
    assert "✓ acme: chain verified" in client.get(reverse("approvals:audit")).content.decode()


def test_audit_chains_fragment_is_404_without_a_history_role(client):
    tenant = TenantFactory(slug="acme")
    client.force_login(member(tenant, Role.APPROVER))

    assert client.get(reverse("approvals:audit-chains")).status_code == 404


def test_every_tenant_s_chain_is_read_from_the_cache_in_one_round_trip(monkeypatch):
    short, long, cached = (TenantFactory(slug=s) for s in ("short", "long", "cached"))
    _history(short, 1)
    _history(long, 3)
    _history(cached, 3)
    # The third's report is in the cache already (as the chains fragment leaves it).
    (report,) = history.chain_statuses([_fresh(cached)], compute_up_to=None)
    reads, computed = [], []
    real_get_many, real_verify = cache.get_many, history.verify_chain
    monkeypatch.setattr(cache, "get_many", lambda keys: reads.append(keys) or real_get_many(keys))
    monkeypatch.setattr(
        history, "verify_chain", lambda t: computed.append(t.slug) or real_verify(t)
    )

    reports = history.chain_statuses([_fresh(short), _fresh(long), _fresh(cached)], compute_up_to=2)

    assert len(reads) == 1 and len(reads[0]) == 3
    # Only the short chain is computed now; the long one is left for the fragment.
    assert computed == ["short"]
    assert [r.ok if r else None for r in reports] == [True, None, True]
    assert reports[2] == report


def _fresh(tenant):
    tenant.refresh_from_db()
    return tenant
