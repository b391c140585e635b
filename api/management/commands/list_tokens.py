"""List API tokens: prefix, tenant, name, scopes, person, expiry, last use, status."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from api.models import ApiToken
from approvals.models import Tenant


def _when(moment) -> str:
    return f"{moment:%Y-%m-%d %H:%M}" if moment else "never"


class Command(BaseCommand):
    help = "List API tokens, newest first: list_tokens [--tenant SLUG]"

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", default="", help="only this tenant's tokens")

    def handle(self, *args, tenant: str, **options) -> None:
        rows = ApiToken.objects.select_related("tenant", "user")
        if tenant:
            if not Tenant.objects.filter(slug=tenant).exists():
                raise CommandError(f"no tenant {tenant!r}")
            rows = rows.filter(tenant__slug=tenant)
        for token in rows:
            self.stdout.write(
                "\t".join(
                    [
                        token.prefix,
                        token.tenant.slug,
                        token.name,
                        ",".join(token.scopes),
                        token.user.get_username() if token.user else "-",
                        f"expires {_when(token.expires_at)}",
                        f"last used {_when(token.last_used_at)}",
                        token.status,
                    ]
                )
            )
