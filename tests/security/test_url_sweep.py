"""Every URL, asked by a user of tenant A about tenant B's objects: 404, and nothing of B shown.

The routes come from the resolver, so a new URL is swept as soon as it exists; its kwargs come
from KWARGS, and a kwarg KWARGS cannot fill fails the sweep with what to add.
"""

from __future__ import annotations

import asyncio
import time
import types
from dataclasses import dataclass, field
from urllib.parse import urlencode

import pytest
from agents.memory import SQLiteSession
from allauth.mfa.models import Authenticator
from django.db import transaction
from django.test import Client
from django.urls import get_resolver, path, resolve

from api import tokens
from approvals import invitations
from approvals.audit import chain as audit
from approvals.audit.chain import verify_chain
from approvals.models import Role, Run, RunStatus, Tenant, Ticket, TicketStatus
from notifications import emails, endpoints, events, fan_out
from notifications.models import Delivery, DeliveryStatus, EmailDelivery, Event, WebhookEndpoint
from sessions_admin.models import StoredItem, StoredSession
from sessions_admin.stores import sqlite_path
from tests.security import (
    Kwarg,
    UnfillableRoute,
    by_first_segment,
    constant,
    fill,
    from_side,
    is_scoped,
    routes,
)
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db


def tenant_slugs(side, route) -> list[str]:
    """B's slug; and A's own slug too where the route also names one of B's objects (an id,
    or a session id in ?id=). A route that names only the tenant is A's own page under A's slug.
    """
    return side.slugs if any(k != "tenant" for k in route.kwargs) else side.slugs[:1]


# kwarg name -> how to fill it with tenant B's objects. A new URL kwarg goes here.
KWARGS: dict[str, Kwarg] = {
    "pk": Kwarg(
        by_first_segment(
            tickets=lambda side: side.ticket.pk,
            runs=lambda side: side.run.pk,
            team=lambda side: side.invitation_ids[0],
            # B's member's passkey: nobody else may rename or remove it.
            accounts=lambda side: side.passkey_ids[0],
        ),
        scoped=True,
    ),
    # Not an object: the export covers the user's own tenants in any format.
    "fmt": Kwarg(constant("csv", "jsonl", "xml"), scoped=False),
    "store": Kwarg(constant("django", "sqlite"), scoped=False),
    # B's slug, and A's own slug with B's session ids: neither may reach B's conversation.
    "tenant": Kwarg(tenant_slugs, scoped=True),
    "session_id": Kwarg(from_side("session_ids"), scoped=True),
    # The webhook pages: B's endpoint and delivery, under B's slug and under A's own.
    "endpoint": Kwarg(from_side("endpoint_ids"), scoped=True),
    "delivery": Kwarg(from_side("delivery_ids"), scoped=True),
    # The email log: B's failed email, under B's slug and under A's own.
    "email": Kwarg(from_side("email_ids"), scoped=True),
    # The API token pages: B's token, by its visible prefix.
    "prefix": Kwarg(from_side("token_prefixes"), scoped=True),
    # The Team pages: B's members, by user id.
    "user_id": Kwarg(from_side("member_ids"), scoped=True),
    # An invitation's link is its own credential, for anyone who holds it: a token nobody was
    # sent must show nothing.
    "token": Kwarg(constant("x" * 43), scoped=False),
    # Single sign-on: the configured provider's id, and one that is not configured.
    "provider_id": Kwarg(constant("sso", "nobody"), scoped=False),
}
# Query parameters that name an object (the sessions pages take ?id=SESSION): every
# object-scoped URL is also asked with each of tenant B's values.
QUERY = {"id": lambda side: side.session_ids}

B_NAME = "Bravo Confidential Holdings"
B_SLUG = "bravo-corp"
B_RELEASE = "2031.01.02-bravo"
B_REQUESTER = "bravo-requester"
B_CONVERSATION = "bravo private conversation about the merger"
B_SESSIONS = ["bravo-orm-session", "bravo-sqlite-session"]
B_WEBHOOK = "https://bravo-hooks.example/merger-channel"
ROLES = [Role.VIEWER, Role.APPROVER, Role.AUDITOR, Role.ADMIN]


@dataclass
class Side:
    tenant: Tenant
    ticket: Ticket
    run: Run
    slugs: list[str]
    session_ids: list[str]
    endpoint_ids: list[int] = field(default_factory=list)
    delivery_ids: list[int] = field(default_factory=list)
    email_ids: list[int] = field(default_factory=list)
    token_prefixes: list[str] = field(default_factory=list)
    member_ids: list[int] = field(default_factory=list)
    invitation_ids: list[int] = field(default_factory=list)
    passkey_ids: list[int] = field(default_factory=list)


def webhook_for(tenant: Tenant, admin, url: str) -> tuple[WebhookEndpoint, Delivery]:
    """An endpoint with one failed delivery, so that a retry would change something."""
    endpoint, _ = endpoints.create_endpoint(
        tenant=tenant, user=admin, url=url, events=list(Event.values)
    )
    with transaction.atomic():
        event = audit.append(tenant_id=tenant.pk, action="run.failed", actor_name="worker")
    fan_out.fan_out(audit_event=event)
    delivery = Delivery.objects.get(endpoint=endpoint)
    Delivery.objects.filter(pk=delivery.pk).update(status=DeliveryStatus.FAILED, attempts=5)
    return endpoint, delivery


def failed_email_for(tenant: Tenant) -> EmailDelivery:
    """A failed email, so that a retry would change something; its subject names the tenant
    and its address the tenant's slug, so a page that shows it to another tenant leaks."""
    with transaction.atomic():
        event = audit.append(tenant_id=tenant.pk, action="run.failed", actor_name="worker")
    subject, text = emails.email_for(events.facts_for(event, Event.RUN_FAILED))
    return EmailDelivery.objects.create(
        tenant=tenant,
        audit_event_id=event.pk,
        event=Event.RUN_FAILED,
        recipient=f"ops@{tenant.slug}.example",
        subject=subject,
        body=text,
        status=DeliveryStatus.FAILED,
        attempts=5,
    )


@pytest.fixture(autouse=True)
def _local_stores(settings, tmp_path):
    settings.APPROVALS_SQLITE_SESSION_DIR = tmp_path / "sessions"
    settings.APPROVALS_SQLITE_SESSION_DIR.mkdir()
    settings.REDIS_URL = ""
    settings.APPROVALS_OPENAI_BASE_URL = ""


def sessions_for(tenant: Tenant, orm_id: str, sqlite_id: str, text: str) -> None:
    item = {"role": "user", "content": text}
    stored = StoredSession.objects.create(tenant=tenant, session_id=orm_id)
    StoredItem.objects.create(session=stored, data=item)
    session = SQLiteSession(sqlite_id, sqlite_path(tenant))
    try:
        asyncio.run(session.add_items([item]))
    finally:
        session.close()


@pytest.fixture
def world() -> dict:
    alpha = TenantFactory(slug="alpha", name="Alpha Ltd")
    alpha_run = paused_run(alpha, requested_by=member(alpha, Role.VIEWER, username="alpha-req"))
    sessions_for(alpha, "alpha-orm-session", "alpha-sqlite-session", "alpha conversation")
    bravo = TenantFactory(slug=B_SLUG, name=B_NAME)
    bravo_run = paused_run(
        bravo,
        prompt=f"Deploy release {B_RELEASE} to production",
        requested_by=member(bravo, Role.VIEWER, username=B_REQUESTER),
    )
    bravo_admin = member(bravo, Role.ADMIN, username="bravo-admin")
    sessions_for(bravo, *B_SESSIONS, B_CONVERSATION)
    endpoint, delivery = webhook_for(bravo, bravo_admin, B_WEBHOOK)
    email = failed_email_for(bravo)
    token = tokens.issue(
        tenant=bravo, name="bravo deploy bot", scopes=["runs:read"], created_by=bravo_admin
    ).token
    invitation = invitations.invite(
        tenant=bravo, email="new@bravo-corp.example", role=Role.APPROVER, actor=bravo_admin
    ).invitation
    passkey = Authenticator.objects.create(
        user=bravo_admin,
        type=Authenticator.Type.WEBAUTHN,
        data={"name": "bravo-admin's key", "credential": {}, "passwordless": True},
    )
    return {
        "alpha": alpha,
        "alpha_run": alpha_run,
        "bravo": Side(
            tenant=bravo,
            ticket=Ticket.objects.get(run=bravo_run),
            run=bravo_run,
            slugs=[B_SLUG, "alpha"],
            session_ids=B_SESSIONS,
            endpoint_ids=[endpoint.pk],
            delivery_ids=[delivery.pk],
            email_ids=[email.pk],
            token_prefixes=[token.prefix],
            member_ids=[bravo_admin.pk],
            invitation_ids=[invitation.pk],
            passkey_ids=[passkey.pk],
        ),
    }


def body(response) -> str:
    content = b"".join(response.streaming_content) if response.streaming else response.content
    return content.decode(errors="replace")


def leaks(text: str, asked: str) -> list[str]:
    """Tenant B's facts found in a response; what the user typed themselves does not count."""
    markers = [B_NAME, B_RELEASE, B_REQUESTER, B_CONVERSATION, B_SLUG, B_WEBHOOK, *B_SESSIONS]
    return [m for m in markers if m in text and m not in asked]


HOSTILE_FORM = {
    "tenant": B_SLUG,
    "prefix": "bravo",
    "older_than": "1d",
    "confirm": "1",
    "next": "/",
    "decision": "approve",
    "resolution": "abandon",
}


def with_query(url: str, side) -> list[str]:
    urls = [url]
    for name, values in QUERY.items():
        urls += [f"{url}?{urlencode({name: value})}" for value in values(side)]
    return urls


def fresh_sign_in(client: Client, user) -> None:
    """As if the user had just typed their password again and used their second factor."""
    session = client.session
    now = time.time()
    session["account_authentication_methods"] = [
        {"method": "password", "at": now, "username": user.username, "reauthenticated": True},
        {"method": "mfa", "at": now, "type": "totp", "reauthenticated": True},
    ]
    session["account_authentication_methods_user"] = str(user.pk)
    session.save()


def request(client: Client, user, method: str, url: str, data: dict | None = None):
    # Sign in again each time: a swept POST /logout/ must not turn later requests anonymous.
    # The sign-in is fresh, so pages that ask to re-authenticate first (two-factor) answer.
    if user is not None:
        client.force_login(user)
        fresh_sign_in(client, user)
    if method == "GET":
        return client.get(url, data or {})
    return client.post(url, data or {})


def sweep(client: Client, user, world: dict) -> tuple[list[str], int]:
    """Every route, GET and POST; returns the problems found and how many URLs were asked."""
    problems: list[str] = []
    asked = 0
    side = world["bravo"]
    for route in routes():
        try:
            urls = fill(route, KWARGS, side)
        except UnfillableRoute as error:
            problems.append(str(error))
            continue
        scoped = is_scoped(route, KWARGS)
        if scoped:
            urls = [variant for url in urls for variant in with_query(url, side)]
        for url in urls:
            assert resolve(url.split("?")[0]).func == route.callback, f"{url} misses {route}"
            asked += 1
            attempts = [("GET", None), ("POST", None)]
            if not scoped:
                attempts += [("GET", HOSTILE_FORM), ("POST", HOSTILE_FORM)]
            statuses = {}
            for method, data in attempts:
                response = request(client, user, method, url, data)
                status = response.status_code
                statuses[method] = status
                text = body(response)
                where = f"{method} {url}{' with tenant B in the form' if data else ''}"
                if status >= 500:
                    problems.append(f"{where} answered {status}")
                if scoped and user is not None and status not in (404, 405):
                    problems.append(f"{where} answered {status}, not 404, for tenant B's object")
                found = leaks(text, url + (str(data) if data else ""))
                if found:
                    problems.append(f"{where} ({status}) shows tenant B's {found}")
            if scoped and user is not None and 404 not in statuses.values():
                problems.append(f"{url} never answered 404 for tenant B's object: {statuses}")
    return problems, asked


def assert_bravo_untouched(world: dict, audit_seq: int) -> None:
    side = world["bravo"]
    assert Ticket.objects.get(pk=side.ticket.pk).status == TicketStatus.PENDING
    assert Run.objects.get(pk=side.run.pk).status == RunStatus.PAUSED
    assert StoredSession.objects.filter(tenant=side.tenant).count() == 1
    assert list(WebhookEndpoint.objects.filter(tenant=side.tenant).values_list("pk", "url")) == [
        (side.endpoint_ids[0], B_WEBHOOK)
    ]
    assert Delivery.objects.get(pk=side.delivery_ids[0]).status == DeliveryStatus.FAILED
    assert EmailDelivery.objects.get(pk=side.email_ids[0]).status == DeliveryStatus.FAILED
    tenant = Tenant.objects.get(pk=side.tenant.pk)
    assert tenant.audit_seq == audit_seq
    assert verify_chain(tenant).ok


@pytest.mark.parametrize("role", ROLES)
def test_url_sweep_another_tenants_objects_are_404_for_every_role(world, role):
    user = member(world["alpha"], role, username=f"alpha-{role}")
    audit_seq = Tenant.objects.get(pk=world["bravo"].tenant.pk).audit_seq

    problems, asked = sweep(Client(raise_request_exception=False), user, world)

    assert problems == []
    # tickets, decide, run, resolve, 3 exports, queue, audit, tenant, login, logout, list,
    # purge, confirm; 2 stores x 2 slugs for detail and clear, each without and with 2 ?id=.
    assert asked >= 30
    assert_bravo_untouched(world, audit_seq)


def test_url_sweep_anonymous_user_sees_nothing_of_any_tenant(world):
    audit_seq = Tenant.objects.get(pk=world["bravo"].tenant.pk).audit_seq

    problems, _ = sweep(Client(raise_request_exception=False), None, world)

    assert problems == []
    assert_bravo_untouched(world, audit_seq)


def test_url_sweep_own_objects_answer_200_so_the_sweep_can_fail(client, world):
    """The control: the same URLs with tenant A's own objects are readable by its admin."""
    alpha_run = world["alpha_run"]
    alpha_admin = member(world["alpha"], Role.ADMIN, username="alpha-admin")
    endpoint, delivery = webhook_for(world["alpha"], alpha_admin, "https://alpha.example/")
    email = failed_email_for(world["alpha"])
    token = tokens.issue(
        tenant=world["alpha"], name="alpha bot", scopes=["runs:read"], created_by=alpha_admin
    ).token
    invitation = invitations.invite(
        tenant=world["alpha"], email="new@alpha.example", role=Role.VIEWER, actor=alpha_admin
    ).invitation
    side = Side(
        tenant=world["alpha"],
        ticket=Ticket.objects.get(run=alpha_run),
        run=alpha_run,
        slugs=["alpha"],
        session_ids=["alpha-orm-session"],
        endpoint_ids=[endpoint.pk],
        delivery_ids=[delivery.pk],
        email_ids=[email.pk],
        token_prefixes=[token.prefix],
        member_ids=[alpha_admin.pk],
        invitation_ids=[invitation.pk],
        passkey_ids=[
            Authenticator.objects.create(
                user=alpha_admin,
                type=Authenticator.Type.WEBAUTHN,
                data={"name": "alpha key", "credential": {}, "passwordless": True},
            ).pk
        ],
    )
    client.force_login(alpha_admin)
    fresh_sign_in(client, alpha_admin)
    statuses = {}
    for route in routes():
        if is_scoped(route, KWARGS):
            url = with_query(fill(route, KWARGS, side)[0], side)[-1]
            statuses[route.name] = client.get(url).status_code

    assert statuses == {
        "approvals:ticket": 200,
        "approvals:decide": 405,
        # No approval held for a second factor: back to the ticket.
        "approvals:step-up": 302,
        "approvals:claim": 405,
        "approvals:comment": 405,
        "approvals:edit": 200,
        "approvals:ticket-record": 200,
        "approvals:ticket-record-export": 200,
        "approvals:run": 200,
        "approvals:resolve": 405,
        "sessions_admin:clear": 200,
        "sessions_admin:detail": 200,
        "notifications:webhooks": 200,
        "notifications:webhook": 200,
        "notifications:delete": 405,
        "notifications:ping": 405,
        "notifications:deliveries": 200,
        "notifications:retry": 405,
        "notifications:emails": 200,
        "notifications:email_retry": 405,
        "api:token-revoke": 200,
        "approvals:member-role": 405,
        "approvals:member-remove": 200,
        "approvals:invitation-revoke": 405,
        "mfa_remove_webauthn": 200,
        "mfa_edit_webauthn": 200,
    }


def _view(request):  # pragma: no cover - never called, only routed
    raise AssertionError


def test_url_sweep_fails_for_a_kwarg_it_cannot_fill(world):
    urlconf = types.ModuleType("hostile_urls")
    urlconf.urlpatterns = [
        path("tickets/<int:pk>/", _view, name="ticket"),
        path("webhooks/<uuid:hook_id>/", _view, name="hook"),
        path("reports/<int:pk>/", _view, name="report"),
    ]

    found = routes(get_resolver(urlconf))
    messages = []
    for route in found:
        try:
            fill(route, KWARGS, world["bravo"])
        except UnfillableRoute as error:
            messages.append(str(error))

    assert [r.route for r in found] == [
        "tickets/<int:pk>/",
        "webhooks/<uuid:hook_id>/",
        "reports/<int:pk>/",
    ]
    assert messages == [
        "/webhooks/<uuid:hook_id>/ (hook) takes the kwarg 'hook_id', which the security sweep "
        "cannot fill. Add 'hook_id' to KWARGS in tests/security/test_url_sweep.py (for this "
        "route's first segment, if the kwarg means different objects on different routes), "
        "giving the object of another tenant that the route must refuse with 404.",
        "/reports/<int:pk>/ (report) takes the kwarg 'pk', which the security sweep cannot "
        "fill. Add 'pk' to KWARGS in tests/security/test_url_sweep.py (for this route's first "
        "segment, if the kwarg means different objects on different routes), giving the "
        "object of another tenant that the route must refuse with 404.",
    ]


def test_url_sweep_walks_the_whole_project_but_admin():
    found = {route.name for route in routes()}

    # A superset: a new URL joins the sweeps without editing this list.
    assert found >= {
        "login",
        "logout",
        "approvals:queue",
        "approvals:ticket",
        "approvals:decide",
        "approvals:claim",
        "approvals:comment",
        "approvals:batch",
        "approvals:edit",
        "approvals:ticket-record",
        "approvals:ticket-record-export",
        "approvals:run",
        "approvals:resolve",
        "approvals:audit",
        "approvals:audit-export",
        "approvals:switch-tenant",
        "sessions_admin:list",
        "sessions_admin:purge",
        "sessions_admin:purge-confirm",
        "sessions_admin:clear",
        "sessions_admin:detail",
        "notifications:index",
        "notifications:webhooks",
        "notifications:webhook",
        "notifications:delete",
        "notifications:ping",
        "notifications:deliveries",
        "notifications:retry",
        "notifications:emails",
        "notifications:email_retry",
    }
    assert not any(route.route.startswith("admin/") for route in routes())
