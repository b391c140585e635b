"""Re-encrypt every stored run state under the primary key (the first in the key ring), then
everything else the console keeps under its keys (signals.secrets_rotating: webhook secrets)."""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand

from approvals import signals
from approvals.core import crypto
from approvals.execution import state


class Command(BaseCommand):
    help = "Re-encrypt stored run states under the primary key of APPROVALS_ENCRYPTION_KEYS."

    def handle(self, *args, **options) -> None:
        counts = state.rotate_keys()
        self.stdout.write(
            f"primary key {crypto.primary_key_id()}: {counts['rotated']} re-encrypted, "
            f"{counts['already_current']} already current, {counts['failed']} could not be opened"
        )
        failed = counts["failed"]
        for _receiver, rotation in signals.secrets_rotating.send(sender=None):
            if rotation.rotated or rotation.failed:
                self.stdout.write(
                    f"{rotation.what}: {rotation.rotated} re-encrypted, "
                    f"{rotation.failed} could not be opened"
                )
            failed += rotation.failed
        if failed:
            self.stderr.write("some states could not be opened with any key in the ring")
            sys.exit(1)
