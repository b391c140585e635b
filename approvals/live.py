"""Live hints to the console's pages. A hint says what changed; the page re-reads the database.

Sent after commit only, and never allowed to break the write that caused it.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)


def tenant_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}"


def _send(tenant_id: int, message: dict[str, Any]) -> None:
    try:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(tenant_group(tenant_id), message)
    except Exception:
        # Live updates are a convenience; pages still show the truth on the next load.
        logger.warning("live update for tenant %s not delivered", tenant_id, exc_info=True)


def notify_on_commit(tenant_id: int, kind: str, **data: Any) -> None:
    message = {"type": "console.event", "kind": kind, **data}
    transaction.on_commit(lambda: _send(tenant_id, message))
