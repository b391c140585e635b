"""Give a member of a tenant another role."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from approvals import tenancy
from approvals.core.errors import DomainError
from approvals.management.tenants import tenant_named, user_named


class Command(BaseCommand):
    help = (
        "Set a member's role: set_role --tenant SLUG --user NAME --role ROLE. Roles: "
        f"{', '.join(tenancy.ROLES)}. A tenant's last admin stays an admin."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        parser.add_argument("--user", required=True, help="the member's name")
        parser.add_argument("--role", required=True, metavar="|".join(tenancy.ROLES))

    def handle(self, *args, tenant: str, user: str, role: str, **options) -> None:
        tenant_row = tenant_named(tenant)
        person = user_named(user)
        try:
            change = tenancy.set_role(tenant=tenant_row, user=person, role=role, channel="command")
        except DomainError as error:
            raise CommandError(error.sentence()) from None
        if not change.changed:
            self.stdout.write(
                f"{user}'s role in {tenant_row.slug} is already {role}; nothing changed"
            )
            return
        self.stdout.write(
            f"{user}'s role in {tenant_row.slug} is now {role} (was {change.previous})"
        )
