"""Start a registered agent from the shell: the same start_run the API calls; the worker runs it."""

from __future__ import annotations

import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals.core.errors import DomainError
from approvals.core.links import public_url
from approvals.models import Tenant
from approvals.runs.start import start_run


class Command(BaseCommand):
    help = (
        "Start a registered agent in a worker: start_run --tenant SLUG --agent KEY --version V "
        "--input TEXT [--session ID] [--context JSON] [--user NAME] [--title T]. Prints the "
        "run's id and its page."
    )

    def add_base_argument(self, parser, *args, **kwargs) -> None:
        # --version names the agent's version here, not Django's.
        if "--version" not in args:
            super().add_base_argument(parser, *args, **kwargs)

    def add_arguments(self, parser) -> None:
        parser.add_argument("--tenant", required=True, help="the tenant's slug")
        parser.add_argument("--agent", required=True, help="the agent key")
        parser.add_argument("--version", required=True, dest="agent_version")
        parser.add_argument("--input", required=True, dest="prompt", help="the prompt")
        parser.add_argument("--session", default="", help="the conversation session id")
        parser.add_argument("--context", default="", help="the context, a JSON object")
        parser.add_argument("--user", default="", help="the person requesting the run")
        parser.add_argument("--title", default="")

    def handle(
        self,
        *args,
        tenant: str,
        agent: str,
        agent_version: str,
        prompt: str,
        session: str,
        context: str,
        user: str,
        title: str,
        **options,
    ) -> None:
        tenant_row = Tenant.objects.filter(slug=tenant).first()
        if tenant_row is None:
            raise CommandError(f"no tenant {tenant!r}")
        person = None
        if user:
            person = get_user_model().objects.filter(username=user).first()
            if person is None:
                raise CommandError(f"no user named {user!r}")
        parsed = None
        if context:
            try:
                parsed = json.loads(context)
            except ValueError as error:
                raise CommandError(f"--context is not JSON: {error}") from None
            if not isinstance(parsed, dict):
                raise CommandError("--context must be a JSON object")
        try:
            run = start_run(
                tenant=tenant_row,
                agent_key=agent,
                agent_version=agent_version,
                input=prompt,
                requested_by=person,
                session_id=session,
                context=parsed,
                title=title,
                via={"via": "command"},
            )
        except DomainError as error:
            raise CommandError(error.sentence()) from None
        self.stdout.write(f"run {run.pk} starting: {public_url('approvals:run', run.pk)}")
