from __future__ import annotations

import pytest
from django.core.cache import cache

from tests.accounts.oidc_provider import oidc_provider, oidc_server  # noqa: F401


@pytest.fixture(autouse=True)
def _fresh_rate_limits():
    # allauth counts sign-ins per address in the cache ("login": 30/m/ip): the suite's many
    # sign-ins from 127.0.0.1 within a minute must not refuse these tests' sign-ins.
    cache.clear()
