"""Re-encrypt every stored run state under the primary key (the first in the key ring)."""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand

from approvals import services
from approvals.core import crypto
from notifications import services as notifications


class Command(BaseCommand):
    help = "Re-encrypt stored run states under the primary key of APPROVALS_ENCRYPTION_KEYS."

    def handle(self, *args, **options) -> None:
        counts = services.rotate_keys()
        self.stdout.write(
            f"primary key {crypto.primary_key_id()}: {counts['rotated']} re-encrypted, "
            f"{counts['already_current']} already current, {counts['failed']} could not be opened"
        )
        webhooks = notifications.rotate_webhook_secrets()
        if webhooks["rotated"] or webhooks["failed"]:
            self.stdout.write(
                f"webhook secrets: {webhooks['rotated']} re-encrypted, "
                f"{webhooks['failed']} could not be opened"
            )
        if counts["failed"] or webhooks["failed"]:
            self.stderr.write("some states could not be opened with any key in the ring")
            sys.exit(1)
