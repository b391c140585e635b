"""Webhook endpoints: the signing secret is stored sealed, bound to its endpoint, and re-sealed
under a new primary key."""

from __future__ import annotations

import pytest

from approvals.core.crypto import CryptoError
from notifications import endpoints
from notifications.models import WebhookEndpoint
from tests.notifications.conftest import make_endpoint

pytestmark = pytest.mark.django_db


def test_endpoint_secret_is_stored_sealed_and_bound_to_its_endpoint(tenant, admin):
    endpoint, secret = make_endpoint(tenant, admin)
    other, _ = make_endpoint(tenant, admin)

    stored = WebhookEndpoint.objects.get(pk=endpoint.pk)
    assert secret.startswith("whsec_") and len(secret) > 40
    assert secret.encode() not in bytes(stored.secret_ciphertext)
    assert endpoints.endpoint_secret(stored) == secret
    # The sealed blob moved to another endpoint does not open.
    WebhookEndpoint.objects.filter(pk=other.pk).update(
        secret_nonce=stored.secret_nonce, secret_ciphertext=stored.secret_ciphertext
    )
    with pytest.raises(CryptoError):
        endpoints.endpoint_secret(WebhookEndpoint.objects.get(pk=other.pk))


def test_rotate_webhook_secrets_reseals_under_the_new_primary_key(tenant, admin, settings):
    endpoint, secret = make_endpoint(tenant, admin)
    old = list(settings.APPROVALS_ENCRYPTION_KEYS)
    settings.APPROVALS_ENCRYPTION_KEYS = [("new1", b"k" * 32), *old]

    assert endpoints.rotate_webhook_secrets() == {"rotated": 1, "failed": 0}

    stored = WebhookEndpoint.objects.get(pk=endpoint.pk)
    assert stored.secret_key_id == "new1"
    assert endpoints.endpoint_secret(stored) == secret
