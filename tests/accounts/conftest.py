from __future__ import annotations

import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def fresh_cache():
    """allauth keeps its rate limits (sign-ins per address, codes per person) and its used-TOTP
    markers in the cache: each test starts with none, whatever ran before it."""
    cache.clear()
    yield
    cache.clear()
