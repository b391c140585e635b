"""Demo tenants, users of every role and paused runs waiting for a decision. Idempotent.

Works on any fresh database whatever var/ holds: each demo run gets a conversation session of
its own, named when the run is made (the Run row keeps the name), so sessions that a run of
another database finished are never resumed, and never touched.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sqlite3
from datetime import timedelta

from agents import Runner
from agents.extensions.memory import RedisSession
from agents.memory import SQLiteSession
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from approvals.execution import registry
from approvals.models import ApprovalPolicy, ApproverGroup, Membership, Role, Run, Tenant
from approvals.policies.groups import save_group
from approvals.policies.versions import save_policy
from approvals.runs.pause import pause_run
from notifications import endpoints
from notifications.models import Event, WebhookEndpoint
from notifications.targets import WebhookURLError
from sessions_admin.models import StoredItem, StoredSession
from sessions_admin.orm_session import DjangoSession
from sessions_admin.stores import redis_prefix, sqlite_path

DEMO_PASSWORD = "demo-pass-2026"
DEMO_WEBHOOK_DESCRIPTION = "Demo receiver: manage.py webhook_receiver, started by bin/run-dev"


def demo_webhook_url() -> str:
    """Where bin/run-dev starts `manage.py webhook_receiver` ($WEBHOOK_PORT, else 8025): acme's
    demo webhook points there."""
    return f"http://127.0.0.1:{os.environ.get('WEBHOOK_PORT') or 8025}/"


TENANTS = {"acme": "Acme Corp", "globex": "Globex"}
# username suffix -> role; "requester" starts agent runs and so may not approve them.
USERS = {
    "approver": Role.APPROVER,
    "approver2": Role.APPROVER,
    # A third approver: two approve under a two-approval policy while the third watches.
    "approver3": Role.APPROVER,
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
                    user, created = User.objects.get_or_create(
                        username=f"{slug}-{suffix}",
                        # Notification emails go to the console in development.
                        defaults={"email": f"{slug}-{suffix}@example.com"},
                    )
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
            for slug, tenant in tenants.items():
                _seed_policy(tenant, slug)

        webhook = _seed_webhook(tenants["acme"], User.objects.get(username="acme-admin"))

        session_dir = settings.APPROVALS_SQLITE_SESSION_DIR
        session_dir.mkdir(parents=True, exist_ok=True)
        created_runs = 0
        for index, (slug, agent_key, prompt) in enumerate(DEMO_RUNS, start=1):
            tenant = tenants[slug]
            if Run.objects.filter(tenant=tenant, agent_key=agent_key, title=prompt).exists():
                continue
            requester = User.objects.get(username=f"{slug}-requester")
            # A new session for a new run: the tenant's file may hold the conversation of a
            # demo run of another database (already approved and finished), which must be
            # neither resumed here nor cleared.
            session = SQLiteSession(
                f"demo-{slug}-{index}-{secrets.token_hex(4)}", sqlite_path(tenant)
            )
            try:
                agent = registry.get_spec(agent_key, "1").build()
                # The deploy token is a runtime dependency: the release agent's context
                # serializer leaves it out of the stored state, its deserializer restores it.
                context = {
                    "tenant": slug,
                    "deploy_token": os.environ.get("RELEASE_DEPLOY_TOKEN", ""),
                }
                result = asyncio.run(Runner.run(agent, prompt, context=context, session=session))
                pause_run(
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

        seeded_sessions = sum(_seed_sessions(tenant) for tenant in tenants.values())

        self.stdout.write(
            f"demo data ready ({created_runs} new paused runs, {seeded_sessions} new sessions)"
        )
        self.stdout.write(f"  password for every demo user: {DEMO_PASSWORD}")
        for slug in TENANTS:
            names = ", ".join(f"{slug}-{suffix} ({role})" for suffix, role in USERS.items())
            self.stdout.write(f"  {slug}: {names}")
        self.stdout.write("  admin (Django admin superuser)")
        self.stdout.write(
            f"  acme webhook {webhook.pk} -> {webhook.url} (manage.py webhook_receiver)"
            if isinstance(webhook, WebhookEndpoint)
            else f"  acme webhook not seeded: {webhook}"
        )


def _seed_webhook(tenant: Tenant, admin) -> WebhookEndpoint | str:
    """acme's demo webhook, for every event, to the local development receiver. Idempotent; when
    the receiver's port changed (WEBHOOK_PORT), the demo webhook moves to it.

    Where private webhook targets are refused (NOTIFICATIONS_ALLOW_PRIVATE_WEBHOOKS off, as in
    production) a loopback URL is refused too: then there is no demo webhook, and the reason
    is returned instead.
    """
    url = demo_webhook_url()
    existing = (
        WebhookEndpoint.objects.filter(tenant=tenant, url=url).first()
        or WebhookEndpoint.objects.filter(tenant=tenant, description=DEMO_WEBHOOK_DESCRIPTION)
        .order_by("pk")
        .first()
    )
    try:
        if existing is None:
            endpoint, _ = endpoints.create_endpoint(
                tenant=tenant,
                user=admin,
                url=url,
                description=DEMO_WEBHOOK_DESCRIPTION,
                events=list(Event.values),
            )
            return endpoint
        if existing.url != url:
            return endpoints.update_endpoint(
                existing,
                user=admin,
                url=url,
                description=existing.description,
                events=existing.events,
                active=existing.active,
            )
    except WebhookURLError as error:
        return str(error)
    return existing


# group -> username suffixes; policies name these groups in their rules and escalations.
GROUPS = {
    "release managers": ["approver", "approver2"],
    "security reviewers": ["approver3", "admin"],
}


def _seed_policy(tenant: Tenant, slug: str) -> None:
    """Approver groups and a tenant default equal to the built-in one (1 approval, any approver,
    expire): an admin raises the deploy tool to two approvals from the Policies page."""
    User = get_user_model()  # noqa: N806
    admin = User.objects.get(username=f"{slug}-admin")
    for name, suffixes in GROUPS.items():
        if not ApproverGroup.objects.filter(tenant=tenant, name=name).exists():
            members = list(User.objects.filter(username__in=[f"{slug}-{s}" for s in suffixes]))
            save_group(tenant=tenant, user=admin, name=name, members=members)
    if not ApprovalPolicy.objects.filter(tenant=tenant).exists():
        save_policy(tenant=tenant, user=admin, required_approvals=1, on_expiry="expire")


def _conversation(topic: str) -> list[dict]:
    return [
        {"role": "user", "content": f"Question about {topic}"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": f"Here is what I know about {topic}."}],
        },
    ]


# session id -> idle days; "test-" ones are what an admin purges in the demo.
DEMO_SESSIONS = {"support-1001": 0, "test-smoke-1": 10, "test-smoke-2": 12, "test-fresh-1": 0}


def _seed_sessions(tenant: Tenant) -> int:
    """Sessions in the ORM, the tenant's SQLite file and (with REDIS_URL) Redis. Idempotent."""
    created = 0
    now = timezone.now()
    for session_id, idle_days in DEMO_SESSIONS.items():
        if not StoredSession.objects.filter(tenant=tenant, session_id=session_id).exists():
            asyncio.run(
                DjangoSession(session_id, tenant=tenant).add_items(_conversation(session_id))
            )
            then = now - timedelta(days=idle_days)
            StoredSession.objects.filter(tenant=tenant, session_id=session_id).update(
                created_at=then, updated_at=then
            )
            StoredItem.objects.filter(
                session__tenant=tenant, session__session_id=session_id
            ).update(created_at=then)
            created += 1
        sqlite_id = f"{session_id}-sqlite"
        path = sqlite_path(tenant)
        session = SQLiteSession(sqlite_id, path)
        try:
            if not asyncio.run(session.get_items(limit=1)):
                asyncio.run(session.add_items(_conversation(sqlite_id)))
                created += 1
                stamp = (now - timedelta(days=idle_days)).strftime("%Y-%m-%d %H:%M:%S")
                with sqlite3.connect(path) as connection:
                    connection.execute(
                        "UPDATE agent_sessions SET created_at = ?, updated_at = ? WHERE session_id = ?",
                        (stamp, stamp, sqlite_id),
                    )
                    connection.execute(
                        "UPDATE agent_messages SET created_at = ? WHERE session_id = ?",
                        (stamp, sqlite_id),
                    )
        finally:
            session.close()
    if settings.REDIS_URL:

        async def seed_redis() -> int:
            added = 0
            for session_id in ("support-2001", "test-redis-1"):
                redis_session = RedisSession.from_url(
                    session_id, url=settings.REDIS_URL, key_prefix=redis_prefix(tenant)
                )
                try:
                    if not await redis_session.get_items(limit=1):
                        await redis_session.add_items(_conversation(session_id))
                        added += 1
                finally:
                    await redis_session.close()
            return added

        created += asyncio.run(seed_redis())
    return created
