"""Re-encrypt every stored run state under the primary key (the first in the key ring), then
everything else the console keeps under its keys (signals.secrets_rotating: webhook secrets).

The audit chain needs nothing re-hashed: new events are linked with the first key of
APPROVALS_AUDIT_KEYS, and each event keeps the id of the key that linked it, which must stay
in the ring as long as that event must verify. The command says how many events each key
linked, and fails when one of those keys is missing from the ring.

Decision keys (APPROVALS_DECISION_SIGNING_KEYS) need nothing re-signed either: to rotate, put a
new `id:key` first in the ring (the first signs) and keep the old one after it while callers
may still check decisions it signed; every key in the ring is published. The command says which
key signs and which are published.
"""

from __future__ import annotations

import sys

from django.conf import settings
from django.core.management.base import BaseCommand

from approvals import signals
from approvals.audit import chain
from approvals.core import crypto, signatures
from approvals.execution import state


class Command(BaseCommand):
    help = (
        "Re-encrypt stored run states under the primary key of APPROVALS_ENCRYPTION_KEYS; "
        "report the audit chain's keys (APPROVALS_AUDIT_KEYS needs no re-hashing)."
    )

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
        failed += self._audit_keys()
        self._decision_keys()
        if failed:
            sys.exit(1)

    def _audit_keys(self) -> int:
        """Report the audit chain's keys; the number of keys with events that left the ring."""
        per_key = chain.events_per_key()
        counts = ", ".join(f"{key_id or 'unkeyed'} {n}" for key_id, n in sorted(per_key.items()))
        self.stdout.write(
            f"audit chain: new events linked with key {signatures.audit_key_id()}, nothing to "
            f"re-hash; events per key: {counts or 'none'}"
        )
        ring = {key_id for key_id, _ in settings.APPROVALS_AUDIT_KEYS}
        missing = sorted(key_id for key_id in per_key if key_id and key_id not in ring)
        for key_id in missing:
            self.stderr.write(
                f"{per_key[key_id]} audit events were linked with key {key_id!r}, which is not "
                "in APPROVALS_AUDIT_KEYS: put it back, or verify_audit fails on them"
            )
        return len(missing)

    def _decision_keys(self) -> None:
        keys = signatures.decision_public_keys()
        current = next(k["id"] for k in keys if k["current"])
        self.stdout.write(
            f"decision keys: new decisions signed with {current}, nothing to re-sign; "
            f"published: {', '.join(k['id'] for k in keys)}. To rotate, put a new id:key first "
            "in APPROVALS_DECISION_SIGNING_KEYS and keep the old one after it."
        )
