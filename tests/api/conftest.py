from __future__ import annotations

import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def _fresh_cache():
    """The rate limit and usage counts live in the cache: each test starts with none."""
    cache.clear()
    yield
    cache.clear()
