"""Create a tenant from the shell."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from approvals import tenancy
from approvals.core.errors import DomainError


class Command(BaseCommand):
    help = (
        "Create a tenant: create_tenant --slug SLUG --name NAME. Then add its first admin with "
        "add_member."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--slug", required=True, help="letters, digits, hyphens, underscores")
        parser.add_argument("--name", required=True, help="what people read")

    def handle(self, *args, slug: str, name: str, **options) -> None:
        try:
            tenant = tenancy.create_tenant(slug=slug, name=name, channel="command")
        except DomainError as error:
            raise CommandError(error.sentence()) from None
        self.stdout.write(f"tenant {tenant.slug} ({tenant.name}) created")
