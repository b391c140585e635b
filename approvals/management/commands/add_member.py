"""Make a user a member of a tenant, creating the user if asked."""

from __future__ import annotations

import os

from django.core.management.base import BaseCommand, CommandError

from approvals import tenancy
from approvals.core.errors import DomainError
from approvals.management.tenants import tenant_named


class Command(BaseCommand):
    help = (
        "Add a member: add_member --tenant SLUG --user NAME --role ROLE [--email ADDRESS] "
        "[--create-user [--password-from-env VAR]]. Roles: "
        f"{', '.join(tenancy.ROLES)}. A user created without a password cannot sign in; "
        "API tokens can act as them."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        parser.add_argument("--user", required=True, help="the user's name")
        parser.add_argument("--role", required=True, metavar="|".join(tenancy.ROLES))
        parser.add_argument("--email", default="", help="the user's email address")
        parser.add_argument(
            "--create-user", action="store_true", help="create the user, who must not exist"
        )
        parser.add_argument(
            "--password-from-env",
            default="",
            metavar="VAR",
            help="with --create-user: the environment variable that holds the password",
        )

    def handle(
        self,
        *args,
        tenant: str,
        user: str,
        role: str,
        email: str,
        create_user: bool,
        password_from_env: str,
        **options,
    ) -> None:
        tenant_row = tenant_named(tenant)
        password = None
        if password_from_env:
            if not create_user:
                raise CommandError(
                    "--password-from-env sets the password of a user it creates: add --create-user"
                )
            password = os.environ.get(password_from_env, "")
            if not password:
                raise CommandError(f"The environment variable {password_from_env} is not set.")
        try:
            membership = tenancy.add_member(
                tenant=tenant_row,
                username=user,
                role=role,
                email=email,
                create_user=create_user,
                password=password,
                channel="command",
            )
        except tenancy.UnknownUserError:
            raise CommandError(
                f"No user named {user!r}: add --create-user to create them."
            ) from None
        except DomainError as error:
            raise CommandError(error.sentence()) from None
        created = "created and " if create_user else ""
        self.stdout.write(f"{user} {created}added to {tenant_row.slug} as {membership.role}")
