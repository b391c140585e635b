"""Revoke an API token by its prefix."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from api import tokens
from api.models import ApiToken


class Command(BaseCommand):
    help = "Revoke an API token: revoke_token PREFIX"

    def add_arguments(self, parser) -> None:
        parser.add_argument("prefix", help="the token's 8-character prefix")

    def handle(self, *args, prefix: str, **options) -> None:
        token = ApiToken.objects.filter(prefix=prefix).select_related("revoked_by").first()
        if token is None:
            raise CommandError(f"no API token with prefix {prefix!r}")
        try:
            tokens.revoke(token, channel="command")
        except tokens.TokenRequestError as error:
            raise CommandError(error.sentence()) from None
        self.stdout.write(f"token {token.prefix} ({token.name}) revoked")
