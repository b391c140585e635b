"""Remove a member from a tenant."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from approvals import tenancy
from approvals.core.errors import DomainError
from approvals.management.tenants import tenant_named, user_named


class Command(BaseCommand):
    help = (
        "Remove a member: remove_member --tenant SLUG --user NAME. A tenant's last admin stays; "
        "the user is signed out everywhere at once."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        parser.add_argument("--user", required=True, help="the member's name")

    def handle(self, *args, tenant: str, user: str, **options) -> None:
        tenant_row = tenant_named(tenant)
        person = user_named(user)
        try:
            tenancy.remove_member(tenant=tenant_row, user=person, channel="command")
        except DomainError as error:
            raise CommandError(error.sentence()) from None
        self.stdout.write(f"{user} removed from {tenant_row.slug}")
