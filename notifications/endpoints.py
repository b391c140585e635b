"""Webhook endpoints: create, change and delete them, and their sealed signing secrets.

A secret (`whsec_<base64>`, notifications.signing) is sealed with the console's keys
(approvals.core.crypto), bound to its tenant and endpoint, and shown once at creation;
endpoint_secret opens it to sign a delivery.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.db import transaction
from django.utils import timezone

from approvals.audit import chain
from approvals.core import crypto
from approvals.models import Tenant
from notifications import signing
from notifications.models import WebhookEndpoint
from notifications.targets import check_url

SECRET_PURPOSE = "webhook-secret"


# --- secrets --------------------------------------------------------------------------------


def _binding(endpoint: WebhookEndpoint) -> dict[str, object]:
    return {"tenant": endpoint.tenant_id, "endpoint": endpoint.pk}


def _seal_secret(endpoint: WebhookEndpoint, secret: str) -> None:
    sealed = crypto.seal(secret.encode(), purpose=SECRET_PURPOSE, **_binding(endpoint))
    endpoint.secret_key_id = sealed.key_id
    endpoint.secret_nonce = sealed.nonce
    endpoint.secret_ciphertext = sealed.ciphertext


def endpoint_secret(endpoint: WebhookEndpoint) -> str:
    """The signing secret, in the standard form (an older endpoint's URL-safe secret is the same
    key: signing.standard_secret). Raises crypto.CryptoError when it cannot be opened, or its
    text is no secret."""
    opened = crypto.open_sealed(
        crypto.Sealed(
            endpoint.secret_key_id, bytes(endpoint.secret_nonce), bytes(endpoint.secret_ciphertext)
        ),
        purpose=SECRET_PURPOSE,
        **_binding(endpoint),
    ).decode()
    try:
        return signing.standard_secret(opened)
    except ValueError as error:
        raise crypto.CryptoError(str(error)) from None


def rotate_webhook_secrets() -> dict[str, int]:
    """Re-seal every endpoint secret under the primary key (called by rotate_keys).

    Side effects: each endpoint not under the primary key is re-sealed in its own transaction,
    its secret written in the standard form (the same key).
    """
    primary = crypto.primary_key_id()
    counts = {"rotated": 0, "failed": 0}
    ids = WebhookEndpoint.objects.exclude(secret_key_id=primary).values_list("pk", flat=True)
    for pk in list(ids):
        with transaction.atomic():
            endpoint = WebhookEndpoint.objects.select_for_update().get(pk=pk)
            try:
                secret = endpoint_secret(endpoint)
            except crypto.CryptoError:
                counts["failed"] += 1
                continue
            _seal_secret(endpoint, secret)
            endpoint.save(update_fields=["secret_key_id", "secret_nonce", "secret_ciphertext"])
            counts["rotated"] += 1
    return counts


# --- create, change, delete -----------------------------------------------------------------


def audited_host(url: str) -> str:
    # The audit log names the host only: a path or query may carry a receiver's token.
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def create_endpoint(
    *,
    tenant: Tenant,
    user,
    url: str,
    description: str = "",
    events: list[str],
    active: bool = True,
) -> tuple[WebhookEndpoint, str]:
    """Create an endpoint with a new signing secret; returns it with the secret, shown once.

    Side effects: inserts the endpoint with the secret sealed; audit webhook.created.
    """
    check_url(url)
    secret = signing.new_secret()
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.create(
            tenant=tenant,
            url=url,
            description=description,
            events=sorted(set(events)),
            active=active,
            created_by=user,
        )
        # The sealed secret is bound to the endpoint's id, so it is sealed once the row exists.
        _seal_secret(endpoint, secret)
        endpoint.save(update_fields=["secret_key_id", "secret_nonce", "secret_ciphertext"])
        chain.append(
            tenant_id=tenant.pk,
            action="webhook.created",
            actor=user,
            outcome="active" if active else "inactive",
            detail={"endpoint": endpoint.pk, "host": audited_host(url), "events": endpoint.events},
        )
    return endpoint, secret


def update_endpoint(
    endpoint: WebhookEndpoint,
    *,
    user,
    url: str,
    description: str,
    events: list[str],
    active: bool,
) -> WebhookEndpoint:
    """Change an endpoint's URL, description, events or active flag; the secret stays.

    Side effects: updates the row; audit webhook.changed.
    """
    check_url(url, saved=endpoint.url)
    with transaction.atomic():
        endpoint.url = url
        endpoint.description = description
        endpoint.events = sorted(set(events))
        endpoint.active = active
        endpoint.updated_at = timezone.now()
        endpoint.save(update_fields=["url", "description", "events", "active", "updated_at"])
        chain.append(
            tenant_id=endpoint.tenant_id,
            action="webhook.changed",
            actor=user,
            outcome="active" if active else "inactive",
            detail={"endpoint": endpoint.pk, "host": audited_host(url), "events": endpoint.events},
        )
    return endpoint


def delete_endpoint(endpoint: WebhookEndpoint, *, user) -> None:
    """Delete an endpoint and its delivery log.

    Side effects: deletes the endpoint and its deliveries; audit webhook.deleted. A delivery
    task still queued for it finds no row and does nothing.
    """
    with transaction.atomic():
        chain.append(
            tenant_id=endpoint.tenant_id,
            action="webhook.deleted",
            actor=user,
            outcome="deleted",
            detail={"endpoint": endpoint.pk, "host": audited_host(endpoint.url)},
        )
        endpoint.delete()
