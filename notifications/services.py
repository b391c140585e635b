"""Only for callers outside this app that still import notifications.services: delete this
module once they import the modules below (nothing in notifications or its tests uses it).

approvals/management/commands/worker.py (requeue_stale), rotate_keys.py
(rotate_webhook_secrets) and seed_demo.py (create_endpoint, WebhookURLError), and
notifications/management/commands/webhook_receiver.py (endpoint_secret).
"""

from __future__ import annotations

from notifications.deliveries import requeue_stale
from notifications.endpoints import create_endpoint, endpoint_secret, rotate_webhook_secrets
from notifications.targets import WebhookURLError

__all__ = [
    "WebhookURLError",
    "create_endpoint",
    "endpoint_secret",
    "requeue_stale",
    "rotate_webhook_secrets",
]
