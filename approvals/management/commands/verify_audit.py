"""Recompute every tenant's audit hash chain; exit non-zero naming the first broken event."""

from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

from approvals.audit.chain import verify_chain
from approvals.models import Tenant


class Command(BaseCommand):
    help = "Verify the audit log's hash chains (all tenants, or --tenant SLUG)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", help="only this tenant's chain")

    def handle(self, *args, tenant: str | None, **options) -> None:
        tenants = Tenant.objects.all()
        if tenant:
            tenants = tenants.filter(slug=tenant)
            if not tenants.exists():
                raise CommandError(f"no tenant {tenant!r}")
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
        if broken:
            sys.exit(1)
