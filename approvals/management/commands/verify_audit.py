"""Recompute every tenant's audit hash chain; exit non-zero naming the first broken event.

With --against FILE, also compare each chain with a signed checkpoint (audit_checkpoint): a
tail cut or rewritten since then is named with its tenant.
"""

from __future__ import annotations

import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from approvals.audit import checkpoints
from approvals.audit.chain import verify_chain
from approvals.core import signatures
from approvals.models import Tenant


class Command(BaseCommand):
    help = "Verify the audit log's hash chains (all tenants, or --tenant SLUG)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", help="only this tenant's chain")
        parser.add_argument(
            "--against",
            metavar="FILE",
            help="also check each chain against this checkpoint (manage.py audit_checkpoint)",
        )
        parser.add_argument(
            "--public-key",
            help="the checkpoint's base64 public key (default: APPROVALS_AUDIT_SIGNING_KEY's)",
        )

    def handle(
        self,
        *args,
        tenant: str | None,
        against: str | None,
        public_key: str | None,
        **options,
    ) -> None:
        tenants = Tenant.objects.all()
        if tenant:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"no tenant {tenant!r}")
        # The checkpoint first: a file that cannot be trusted stops everything.
        statements = None
        if against:
            statements = _load(against, public_key or signatures.public_key())
        broken = 0
        for row in tenants:
            report = verify_chain(row)
            if report.ok:
                self.stdout.write(
                    f"{report.tenant_slug}: {report.events} events, chain intact, "
                    f"{report.unkeyed} unkeyed (legacy)"
                )
            else:
                broken += 1
                where = f"event #{report.broken_seq}"
                if report.broken_event_id is not None:
                    where += f" (id {report.broken_event_id})"
                self.stderr.write(f"{report.tenant_slug}: chain broken at {where}: {report.reason}")
        if statements is not None:
            broken += self._compare(statements, {row.slug for row in tenants}, tenant)
        if broken:
            sys.exit(1)

    def _compare(
        self, statements: list[checkpoints.Statement], slugs: set[str], only: str | None
    ) -> int:
        differing = 0
        for statement in statements:
            if only and statement.tenant != only:
                continue
            problem = checkpoints.compare(statement)
            if problem:
                differing += 1
                self.stderr.write(problem)
            else:
                self.stdout.write(
                    f"{statement.tenant}: event #{statement.seq} as in the checkpoint of "
                    f"{statement.time}"
                )
        for slug in sorted(slugs - {s.tenant for s in statements}):
            self.stdout.write(f"{slug}: not in the checkpoint")
        return differing


def _load(path: str, public_key: str) -> list[checkpoints.Statement]:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise CommandError(f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise CommandError(f"{path}: the checkpoint is not JSON") from None
    try:
        return checkpoints.load(text, public_key=public_key)
    except checkpoints.CheckpointError as error:
        raise CommandError(f"{path}: {error}") from None
