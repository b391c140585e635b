from __future__ import annotations

import pytest

from approvals.audit import chain
from approvals.core import signatures
from tests.support import TenantFactory, append_unkeyed, audit_events

pytestmark = pytest.mark.django_db


def test_events_per_key_counts_keyed_and_unkeyed_events_over_all_tenants():
    first, second = TenantFactory(), TenantFactory()
    append_unkeyed(first)
    audit_events(first, 2)
    audit_events(second, 1)

    assert chain.events_per_key() == {"": 1, signatures.audit_key_id(): 3}


def test_events_per_key_without_events_is_empty():
    assert chain.events_per_key() == {}
