"""Demo tenants, users of every role and paused runs waiting for a decision. Idempotent."""

from __future__ import annotations

import asyncio
import os

from agents import Runner
from agents.memory import SQLiteSession
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from approvals import registry, services
from approvals.models import Membership, Role, Run, Tenant

DEMO_PASSWORD = "demo-pass-2026"
TENANTS = {"acme": "Acme Corp", "globex": "Globex"}
# username suffix -> role; "requester" starts agent runs and so may not approve them.
USERS = {
    "approver": Role.APPROVER,
    "approver2": Role.APPROVER,
    "viewer": Role.VIEWER,
    "auditor": Role.AUDITOR,
    "admin": Role.ADMIN,
    "requester": Role.VIEWER,
}
DEMO_RUNS = [
    ("acme", "release", "Deploy release 2026.07.24 to production"),
    ("acme", "invoice", "Publish test invoice INV-781"),
    ("acme", "release", "Deploy release 2026.07.25 to staging"),
    ("globex", "release", "Deploy release 2026.08.01 to production"),
]


class Command(BaseCommand):
    help = "Create demo tenants, users (one per role) and paused demo runs. Safe to repeat."

    def handle(self, *args, **options) -> None:
        User = get_user_model()  # noqa: N806
        with transaction.atomic():
            tenants = {}
            for slug, name in TENANTS.items():
                tenants[slug], _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
                for suffix, role in USERS.items():
                    user, created = User.objects.get_or_create(username=f"{slug}-{suffix}")
                    if created:
                        user.set_password(DEMO_PASSWORD)
                        user.save()
                    Membership.objects.update_or_create(
                        user=user, tenant=tenants[slug], defaults={"role": role}
                    )
            superuser, created = User.objects.get_or_create(
                username="admin", defaults={"is_staff": True, "is_superuser": True}
            )
            if created:
                superuser.set_password(DEMO_PASSWORD)
                superuser.save()

        session_dir = settings.APPROVALS_SQLITE_SESSION_DIR
        session_dir.mkdir(parents=True, exist_ok=True)
        created_runs = 0
        for index, (slug, agent_key, prompt) in enumerate(DEMO_RUNS, start=1):
            tenant = tenants[slug]
            if Run.objects.filter(tenant=tenant, agent_key=agent_key, title=prompt).exists():
                continue
            requester = User.objects.get(username=f"{slug}-requester")
            session = SQLiteSession(f"demo-{slug}-{index}", session_dir / "demo.sqlite3")
            try:
                agent = registry.get_spec(agent_key, "1").build()
                # The deploy token is a runtime dependency: the release agent's context
                # serializer leaves it out of the stored state, its deserializer restores it.
                context = {
                    "tenant": slug,
                    "deploy_token": os.environ.get("RELEASE_DEPLOY_TOKEN", ""),
                }
                result = asyncio.run(Runner.run(agent, prompt, context=context, session=session))
                services.pause_run(
                    result,
                    tenant=tenant,
                    agent_key=agent_key,
                    agent_version="1",
                    requested_by=requester,
                    session=session,
                )
            finally:
                session.close()
            created_runs += 1

        self.stdout.write(f"demo data ready ({created_runs} new paused runs)")
        self.stdout.write(f"  password for every demo user: {DEMO_PASSWORD}")
        for slug in TENANTS:
            names = ", ".join(f"{slug}-{suffix} ({role})" for suffix, role in USERS.items())
            self.stdout.write(f"  {slug}: {names}")
        self.stdout.write("  admin (Django admin superuser)")
