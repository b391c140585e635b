from __future__ import annotations

import re

import pytest
from django.test import Client

from api import tokens
from api.models import ApiToken
from approvals.models import AuditEvent, Role
from tests.support import TenantFactory, api_token, bearer, member

URL = "/team/tokens/"


@pytest.fixture
def acme(db):
    tenant = TenantFactory(slug="acme", name="Acme")
    return (
        tenant,
        member(tenant, Role.ADMIN, username="ada"),
        member(tenant, Role.APPROVER, username="alice"),
    )


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def create(client: Client, **fields):
    data = {"tenant": "acme", "name": "release pipeline", "scopes": ["runs:read"], "days": "30"}
    data.update(fields)
    return client.post(URL, data)


def test_an_admin_creates_a_token_and_sees_it_once(acme):
    tenant, admin, approver = acme
    client = signed_in(admin)

    response = create(client, scopes=["tickets:read", "tickets:decide"], user="alice")

    assert response.status_code == 201
    page = response.content.decode()
    shown = re.search(r'id="new-token">(apc_[^<]+)<', page).group(1)
    row = ApiToken.objects.get()
    assert (row.name, row.scopes, row.user, row.created_by) == (
        "release pipeline",
        ["tickets:decide", "tickets:read"],
        approver,
        admin,
    )
    assert tokens.authenticate(f"Bearer {shown}") == row
    assert 'data-copy="new-token"' in page
    assert (row.expires_at - row.created_at).days == 30
    assert AuditEvent.objects.filter(action="token.created", actor_id=admin.pk).count() == 1
    # Never again: the list shows the prefix, not the token.
    later = client.get(URL).content.decode()
    assert shown not in later
    assert row.prefix in later
    assert "release pipeline" in later


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"name": ""}, "Give the token a name."),
        ({"scopes": []}, "Choose at least one scope."),
        ({"days": "400"}, "Ensure this value is less than or equal to 365."),
        (
            {"scopes": ["tickets:decide"]},
            "A token with tickets:decide acts as a person: choose who.",
        ),
        (
            {"scopes": ["tickets:decide"], "user": "vic"},
            "A token acting as vic cannot have tickets:decide: they are a viewer of acme",
        ),
    ],
)
def test_a_bad_form_says_what_is_wrong_and_creates_nothing(acme, fields, error):
    tenant, admin, approver = acme
    member(tenant, Role.VIEWER, username="vic")

    response = create(signed_in(admin), **fields)

    assert response.status_code == 400
    assert error.replace("'", "&#x27;") in response.content.decode()
    assert ApiToken.objects.count() == 0
    assert 'id="new-token"' not in response.content.decode()


def test_someone_of_another_tenant_cannot_be_chosen(acme):
    tenant, admin, approver = acme
    member(TenantFactory(slug="globex"), Role.APPROVER, username="gary")

    response = create(signed_in(admin), user="gary")

    assert response.status_code == 400
    assert "Select a valid choice. gary is not one of the available choices." in (
        response.content.decode()
    )
    assert ApiToken.objects.count() == 0


def test_an_admin_revokes_a_token_after_confirming(acme):
    tenant, admin, approver = acme
    row, secret = api_token(tenant, "runs:read")
    client = signed_in(admin)

    confirm = client.get(f"{URL}{row.prefix}/revoke/")
    assert confirm.status_code == 200
    assert f"Revoke token {row.prefix}" in confirm.content.decode()
    assert ApiToken.objects.get(pk=row.pk).revoked_at is None

    response = client.post(f"{URL}{row.prefix}/revoke/", follow=True)

    assert response.redirect_chain == [(URL, 302)]
    row.refresh_from_db()
    assert row.revoked_by == admin
    assert "is revoked: it is refused from now on." in response.content.decode()
    refused = Client().get("/api/v1/runs", headers=bearer(secret))
    assert refused.status_code == 401
    assert refused.json()["detail"].endswith(" by ada.")
    again = client.post(f"{URL}{row.prefix}/revoke/", follow=True)
    assert f"Token {row.prefix} was already revoked on " in again.content.decode()
    assert AuditEvent.objects.filter(action="token.revoked").count() == 1


def test_non_admins_get_the_forbidden_page(acme):
    tenant, admin, approver = acme
    row, _ = api_token(tenant, "runs:read")
    client = signed_in(approver)

    for response in (
        client.get(URL),
        create(client),
        client.post(f"{URL}{row.prefix}/revoke/"),
    ):
        assert response.status_code == 403
        assert "Only a tenant&#x27;s admins manage its API tokens." in response.content.decode()
    assert ApiToken.objects.count() == 1
    assert ApiToken.objects.get().revoked_at is None
    # Admins reach the tokens from the nav's Team entry (the members page links them).
    assert 'href="/team/members/"' not in client.get("/").content.decode()
    assert 'href="/team/members/"' in signed_in(admin).get("/").content.decode()
    assert 'href="/team/tokens/"' in signed_in(admin).get("/team/members/").content.decode()


def test_another_tenants_admin_sees_none_of_its_tokens(acme):
    tenant, admin, approver = acme
    row, _ = api_token(tenant, "runs:read")
    other = member(TenantFactory(slug="globex"), Role.ADMIN, username="gina")
    client = signed_in(other)

    assert row.prefix not in client.get(URL).content.decode()
    assert client.get(f"{URL}{row.prefix}/revoke/").status_code == 404
    assert client.post(f"{URL}{row.prefix}/revoke/").status_code == 404
    assert ApiToken.objects.get().revoked_at is None


def test_signed_out_visitors_are_sent_to_sign_in(db):
    response = Client().get(URL)

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_the_docs_page_lists_every_operation_and_needs_nothing_from_outside(db):
    response = Client().get("/api/v1/docs")

    page = response.content.decode()
    assert response.status_code == 200
    for operation in [
        "GET /api/v1/keys",
        "GET /api/v1/runs",
        "POST /api/v1/runs",
        "POST /api/v1/runs/paused",
        "GET /api/v1/runs/{id}",
        "POST /api/v1/runs/{id}/outcome",
        "GET /api/v1/tickets",
        "GET /api/v1/tickets/{id}",
        "POST /api/v1/tickets/{id}/decision",
    ]:
        assert f"<code>{operation}</code>" in page
    # Every script, style and link is the console's own: the machines have no internet.
    external = re.findall(r'(?:src|href)="(https?:)?//[^"]*"', page)
    assert external == []
    assert 'href="/api/v1/openapi.json"' in page
