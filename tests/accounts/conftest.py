from __future__ import annotations

import pytest
from django.core.cache import cache

from tests.accounts.oidc_provider import oidc_provider, oidc_server  # noqa: F401


@pytest.fixture(autouse=True)
def fresh_cache():
    """allauth keeps its rate limits (sign-ins per address, codes per person) and its used-TOTP
    markers in the cache: each test starts with none, whatever ran before it (the suite's many
    sign-ins from 127.0.0.1 within a minute must not refuse these tests' sign-ins)."""
    cache.clear()
    yield
    cache.clear()
