"""Sign every tenant's audit chain head into a checkpoint to keep outside the database."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from approvals.audit import checkpoints
from approvals.core import signatures
from approvals.models import Tenant


class Command(BaseCommand):
    help = (
        "Write a checkpoint of every tenant's audit chain head, signed with "
        "APPROVALS_AUDIT_SIGNING_KEY, for `verify_audit --against`."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--output", metavar="FILE", help="write it here, not to stdout")
        parser.add_argument(
            "--print-public-key",
            action="store_true",
            help="print the public key of APPROVALS_AUDIT_SIGNING_KEY and stop",
        )

    def handle(self, *args, output: str | None, print_public_key: bool, **options) -> None:
        if print_public_key:
            self.stdout.write(signatures.public_key())
            return
        checkpoint = checkpoints.take(Tenant.objects.order_by("slug"))
        if output:
            _write(Path(output), checkpoint.text())
        else:
            self.stdout.write(checkpoint.text(), ending="")
        # Audited (and offered to the tenants' webhooks) once it is written, not before.
        checkpoints.record(checkpoint)
        if output:
            tenants = len(checkpoint.document["tenants"])
            self.stdout.write(f"checkpoint of {tenants} tenants written to {output}")
        for report in checkpoint.broken:
            self.stderr.write(
                f"{report.tenant_slug}: chain broken at event #{report.broken_seq}: "
                f"{report.reason}; left out of the checkpoint"
            )
        if checkpoint.broken:
            sys.exit(1)


def _write(path: Path, text: str) -> None:
    """Replace the file in one step, so that a failure never leaves half a checkpoint."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise CommandError(f"cannot write {path}: {error.strerror}") from None
