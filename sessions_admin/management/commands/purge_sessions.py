"""Purge agent conversation sessions by store and id prefix, with a dry run."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from approvals.models import Tenant
from sessions_admin import services
from sessions_admin.stores import Filters, configured_stores, parse_age


class Command(BaseCommand):
    help = "Clear the sessions of one store whose id starts with PREFIX (dry run or --yes)."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--backend", required=True, help="django, sqlite, redis or openai_conversations"
        )
        parser.add_argument("--prefix", required=True, help="session id prefix, such as test-")
        parser.add_argument(
            "--older-than", default="", help="only sessions idle this long: 30m, 12h, 7d, 2w"
        )
        parser.add_argument("--tenant", default="", help="only this tenant (slug)")
        mode = parser.add_mutually_exclusive_group(required=True)
        mode.add_argument("--dry-run", action="store_true", help="show what would be cleared")
        mode.add_argument("--yes", action="store_true", help="clear them")

    def handle(
        self,
        *args,
        backend: str,
        prefix: str,
        older_than: str,
        tenant: str,
        dry_run: bool,
        yes: bool,
        **options,
    ) -> None:
        names = [s.name for s in configured_stores()]
        if backend not in names:
            raise CommandError(f"no store {backend!r} here (configured: {', '.join(names)})")
        if not prefix:
            raise CommandError("--prefix must not be empty: a purge never takes every session")
        tenants = list(Tenant.objects.all())
        if tenant:
            tenants = [t for t in tenants if t.slug == tenant]
            if not tenants:
                raise CommandError(f"no tenant {tenant!r}")
        try:
            cutoff = timezone.now() - parse_age(older_than) if older_than else None
        except ValueError as error:
            raise CommandError(str(error)) from None
        plan = services.plan_purge(
            store_names=[backend],
            filters=Filters(prefix=prefix, older_than=cutoff, tenants=tenants),
        )
        if plan.errors:
            raise CommandError(f"{backend} cannot be read: {plan.errors[backend]}")
        store_plan = plan.stores[0]
        verb = "would clear" if dry_run else "clearing"
        self.stdout.write(f"{backend}: {verb} {plan.count} sessions, {store_plan.items} items")
        for sample in store_plan.sample:
            self.stdout.write(f"  {sample}")
        if len(store_plan.sessions) > len(store_plan.sample):
            self.stdout.write(f"  … and {len(store_plan.sessions) - len(store_plan.sample)} more")
        if dry_run:
            return
        result = services.purge(plan=plan, actor_name="purge_sessions command")
        self.stdout.write(
            f"{backend}: cleared {len(result.cleared)} sessions, {sum(c[3] for c in result.cleared)} items"
        )
        for store, slug, reason in result.failed:
            self.stderr.write(f"  not cleared: {store} {slug} {reason}")
        if result.failed:
            raise CommandError(f"{len(result.failed)} sessions could not be cleared")
