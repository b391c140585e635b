from __future__ import annotations

from tests.accounts.oidc_provider import oidc_provider, oidc_server  # noqa: F401
