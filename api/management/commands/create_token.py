"""Issue an API token from the shell; it is printed once."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from api import tokens
from approvals.models import Tenant


class Command(BaseCommand):
    help = (
        "Issue an API token: create_token TENANT NAME --scope S [--scope S ...] [--user USERNAME] "
        f"[--days N]. Scopes: {', '.join(tokens.SCOPES)}. The token is printed once."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("tenant", help="the tenant's slug")
        parser.add_argument("name", help="what uses the token")
        parser.add_argument("--scope", action="append", default=[], dest="scopes")
        parser.add_argument("--user", default="", help="the person the token acts as")
        parser.add_argument("--days", type=int, default=tokens.DEFAULT_DAYS)

    def handle(
        self, *args, tenant: str, name: str, scopes: list[str], user: str, days: int, **options
    ):
        tenant_row = Tenant.objects.filter(slug=tenant).first()
        if tenant_row is None:
            raise CommandError(f"no tenant {tenant!r}")
        person = None
        if user:
            person = get_user_model().objects.filter(username=user).first()
            if person is None:
                raise CommandError(f"no user named {user!r}")
        try:
            issued = tokens.issue(
                tenant=tenant_row,
                name=name,
                scopes=scopes,
                user=person,
                days=days,
                channel="command",
            )
        except tokens.TokenRequestError as error:
            raise CommandError(error.sentence()) from None
        token = issued.token
        self.stderr.write(
            f"token {token.prefix} ({token.name}) for {tenant_row.slug}, scopes "
            f"{' '.join(token.scopes)}, expires {token.expires_at:%Y-%m-%d %H:%M} UTC; "
            "it is not shown again:"
        )
        self.stdout.write(issued.secret)
