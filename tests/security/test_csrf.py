"""CSRF on every state-changing request, htmx included: no token, no change.

The routes come from the resolver, filled with the signed-in admin's own objects so that each
request would otherwise reach its view. The websocket's origin and sign-in checks are in
tests/approvals/live/test_consumers.py (test_consumer_refuses_a_foreign_origin_even_when_signed_in,
test_consumer_refuses_an_anonymous_socket).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from allauth.mfa.models import Authenticator
from django.conf import settings as django_settings
from django.test import Client
from django.urls import reverse

from api import tokens
from api.models import ApiToken
from approvals import invitations
from approvals.models import (
    AuditEvent,
    Invitation,
    Membership,
    Role,
    Run,
    Tenant,
    Ticket,
    TicketStatus,
)
from notifications.models import Delivery, EmailDelivery, WebhookEndpoint
from sessions_admin.models import StoredItem, StoredSession
from tests.security import UnfillableRoute, fill, routes
from tests.security.test_url_sweep import KWARGS, failed_email_for, webhook_for, with_query
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db

CSRF_FAILURE = "CSRF verification failed. Request aborted."
UNSAFE_METHODS = ["post", "put", "patch", "delete"]


@dataclass
class Side:
    ticket: Ticket
    run: Run
    slugs: list[str]
    session_ids: list[str]
    endpoint_ids: list[int]
    delivery_ids: list[int]
    email_ids: list[int]
    token_prefixes: list[str]
    member_ids: list[int]
    invitation_ids: list[int]
    passkey_ids: list[int]


@pytest.fixture(autouse=True)
def _local_stores(settings, tmp_path):
    settings.APPROVALS_SQLITE_SESSION_DIR = tmp_path / "sessions"
    settings.APPROVALS_SQLITE_SESSION_DIR.mkdir()
    settings.REDIS_URL = ""


@pytest.fixture
def own():
    tenant = TenantFactory(slug="acme")
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, username="requester"))
    stored = StoredSession.objects.create(tenant=tenant, session_id="acme-session")
    StoredItem.objects.create(session=stored, data={"role": "user", "content": "hello"})
    admin = member(tenant, Role.ADMIN, username="acme-admin")
    endpoint, delivery = webhook_for(tenant, admin, "https://hooks.example.com/acme")
    email = failed_email_for(tenant)
    token = tokens.issue(
        tenant=tenant, name="acme deploy bot", scopes=["runs:read"], created_by=admin
    ).token
    invitation = invitations.invite(
        tenant=tenant, email="new@acme.example", role=Role.APPROVER, actor=admin
    ).invitation
    passkey = Authenticator.objects.create(
        user=admin,
        type=Authenticator.Type.WEBAUTHN,
        data={"name": "acme-admin's key", "credential": {}, "passwordless": True},
    )
    side = Side(
        Ticket.objects.get(run=run),
        run,
        ["acme"],
        ["acme-session"],
        [endpoint.pk],
        [delivery.pk],
        [email.pk],
        [token.prefix],
        [run.requested_by_id],
        [invitation.pk],
        [passkey.pk],
    )
    return tenant, admin, side


FORM = {
    "decision": "approve",
    "action": "claim",
    "text": "a comment",
    "resolution": "abandon",
    "tenant": "acme",
    "prefix": "acme",
    "confirm": "1",
    "next": "/",
    "username": "acme-admin",
    "password": "test-pass-123",
    "url": "https://evil.example/",
    "events": ["ticket.created"],
}


def every_url(side) -> list[str]:
    urls = []
    for route in routes():
        try:
            urls.append(with_query(fill(route, KWARGS, side)[0], side)[-1])
        except UnfillableRoute as error:
            pytest.fail(str(error))
    return urls


def snapshot(tenant: Tenant) -> tuple:
    return (
        list(Ticket.objects.values_list("pk", "status")),
        list(Run.objects.values_list("pk", "status")),
        AuditEvent.objects.count(),
        StoredSession.objects.filter(tenant=tenant).count(),
        list(WebhookEndpoint.objects.values_list("pk", "url", "events", "active")),
        list(Delivery.objects.values_list("pk", "status", "attempts")),
        list(EmailDelivery.objects.values_list("pk", "status", "attempts")),
        list(ApiToken.objects.values_list("pk", "revoked_at")),
        list(Membership.objects.values_list("pk", "role")),
        list(Invitation.objects.values_list("pk", "revoked_at", "accepted_at")),
    )


def csrf_client(user) -> Client:
    client = Client(enforce_csrf_checks=True, raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.mark.parametrize("htmx", [False, True], ids=["form", "htmx"])
@pytest.mark.parametrize("method", UNSAFE_METHODS)
def test_csrf_every_route_refuses_an_unsafe_request_without_a_token(own, method, htmx):
    tenant, admin, side = own
    before = snapshot(tenant)
    headers = {"HX-Request": "true", "HX-Target": "decision"} if htmx else {}
    refused = {}
    for url in every_url(side):
        client = csrf_client(admin)
        response = getattr(client, method)(url, FORM, headers=headers)
        refused[url] = (response.status_code, CSRF_FAILURE in response.content.decode())

    assert refused == dict.fromkeys(refused, (403, True))
    assert len(refused) >= 15
    assert snapshot(tenant) == before


@pytest.mark.parametrize("htmx", [False, True], ids=["form", "htmx"])
def test_csrf_a_forged_token_is_refused_too(own, htmx):
    tenant, admin, side = own
    before = snapshot(tenant)
    client = csrf_client(admin)
    client.get(reverse("approvals:queue"))
    forged = "x" * 32
    headers = {"X-CSRFToken": forged, **({"HX-Request": "true"} if htmx else {})}

    statuses = {
        url: client.post(url, {**FORM, "csrfmiddlewaretoken": forged}, headers=headers).status_code
        for url in every_url(side)
    }

    assert statuses == dict.fromkeys(statuses, 403)
    assert snapshot(tenant) == before


def test_csrf_a_cross_site_origin_is_refused_even_with_a_token(own):
    _, admin, side = own
    client = csrf_client(admin)
    client.get(reverse("approvals:queue"))
    token = client.cookies[django_settings.CSRF_COOKIE_NAME].value

    response = client.post(
        reverse("approvals:decide", args=[side.ticket.pk]),
        {"decision": "reject"},
        headers={"X-CSRFToken": token, "HX-Request": "true", "Origin": "https://evil.example"},
    )

    assert response.status_code == 403
    assert Ticket.objects.get(pk=side.ticket.pk).status == TicketStatus.PENDING


@pytest.mark.parametrize("htmx", [False, True], ids=["form", "htmx"])
def test_csrf_with_the_cookie_token_the_request_passes_so_the_check_can_fail(own, htmx):
    """The control: the same request with the page's token reaches the view."""
    tenant, _, side = own
    approver = member(tenant, Role.APPROVER, username="acme-approver")
    client = csrf_client(approver)
    client.get(reverse("approvals:ticket", args=[side.ticket.pk]))
    token = client.cookies[django_settings.CSRF_COOKIE_NAME].value
    headers = {"X-CSRFToken": token, **({"HX-Request": "true"} if htmx else {})}

    response = client.post(
        reverse("approvals:decide", args=[side.ticket.pk]), {"decision": "reject"}, headers=headers
    )

    assert response.status_code == (200 if htmx else 302)
    assert Ticket.objects.get(pk=side.ticket.pk).status == TicketStatus.REJECTED


def test_csrf_every_post_only_view_refuses_get(own):
    """GET never changes state: a POST-only view answers 405 to it, with the admin's own ids."""
    _, admin, side = own
    client = csrf_client(admin)
    urls = {
        "decide": reverse("approvals:decide", args=[side.ticket.pk]),
        "claim": reverse("approvals:claim", args=[side.ticket.pk]),
        "comment": reverse("approvals:comment", args=[side.ticket.pk]),
        "batch": reverse("approvals:batch"),
        "resolve": reverse("approvals:resolve", args=[side.run.pk]),
        "switch-tenant": reverse("approvals:switch-tenant"),
        "purge-confirm": reverse("sessions_admin:purge-confirm"),
    }

    statuses = {name: client.get(url, FORM).status_code for name, url in urls.items()}
    # The clear page and sign-out answer GET with a confirmation, and only POST acts.
    clear = client.get(
        reverse("sessions_admin:clear", args=["django", "acme"]), {"id": "acme-session"}
    )
    sign_out = client.get(reverse("logout"), FORM)

    assert statuses == dict.fromkeys(urls, 405)
    assert clear.status_code == 200
    assert sign_out.status_code == 200
    assert client.get(reverse("approvals:queue")).status_code == 200
    assert StoredSession.objects.filter(session_id="acme-session").count() == 1
    assert Ticket.objects.get(pk=side.ticket.pk).status == TicketStatus.PENDING


@pytest.mark.parametrize("htmx", [False, True], ids=["form", "htmx"])
def test_csrf_team_routes_refuse_without_a_token_and_pass_with_it(own, htmx):
    """Claim, comment and batch: no token, nothing written; the page's token, written."""
    tenant, _, side = own
    approver = member(tenant, Role.APPROVER, username="acme-approver")
    posts = {
        reverse("approvals:claim", args=[side.ticket.pk]): {"action": "claim"},
        reverse("approvals:comment", args=[side.ticket.pk]): {"text": "on it"},
        reverse("approvals:batch"): {"ticket": [side.ticket.pk], "decision": "reject"},
    }
    client = csrf_client(approver)
    client.get(reverse("approvals:ticket", args=[side.ticket.pk]))
    token = client.cookies[django_settings.CSRF_COOKIE_NAME].value
    hx = {"HX-Request": "true"} if htmx else {}
    before = snapshot(tenant)

    refused = {url: client.post(url, data, headers=hx).status_code for url, data in posts.items()}
    unchanged = snapshot(tenant)
    passed = {
        url: client.post(url, data, headers={"X-CSRFToken": token, **hx}).status_code
        for url, data in posts.items()
    }

    assert refused == dict.fromkeys(posts, 403)
    assert unchanged == before
    assert set(passed.values()) <= {200, 302}
    assert list(
        AuditEvent.objects.filter(tenant=tenant).order_by("seq").values_list("action", flat=True)
    )[-4:] == ["ticket.claimed", "ticket.commented", "ticket.rejected", "run.queued"]
