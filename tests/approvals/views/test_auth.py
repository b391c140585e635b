"""Sign-in, sign-out, the tenant switcher, brute-force lockout and the security headers."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from django.contrib.auth import SESSION_KEY
from django.urls import reverse

from approvals.middleware import ADMIN_CSP, CONSOLE_CSP
from approvals.models import AuditEvent, Role
from tests.support import PASSWORD, TenantFactory, member

pytestmark = pytest.mark.django_db

LOGIN = reverse("login")
LOGOUT = reverse("logout")
QUEUE = reverse("approvals:queue")
SWITCH = reverse("approvals:switch-tenant")
WRONG = "The username and/or password you specified are not correct."


def sign_in(client, username: str, password: str = PASSWORD, **extra):
    return client.post(LOGIN, {"login": username, "password": password, **extra})


def test_login_page_renders_the_form(client):
    response = client.get(LOGIN)

    body = response.content.decode()
    assert response.status_code == 200
    assert '<form method="post" action="/login/">' in body
    assert 'name="csrfmiddlewaretoken"' in body
    assert 'name="password"' in body


def test_login_with_the_right_password_signs_in(client):
    user = member(TenantFactory(), Role.VIEWER)

    response = sign_in(client, user.username)

    assert response.status_code == 302
    assert response["Location"] == "/"
    assert client.session[SESSION_KEY] == str(user.pk)


def test_login_with_a_wrong_password_shows_an_error(client):
    user = member(TenantFactory(), Role.VIEWER)

    response = sign_in(client, user.username, "wrong-password")

    assert response.status_code == 200
    assert WRONG in response.content.decode()
    assert SESSION_KEY not in client.session


def test_login_failure_is_audited_in_the_users_tenants(client):
    one, two = TenantFactory(), TenantFactory()
    user = member(one, Role.VIEWER)
    member(two, Role.APPROVER, username=user.username)

    sign_in(client, user.username, "wrong-password")

    events = AuditEvent.objects.filter(action="auth.sign_in_failed").order_by("tenant_id")
    assert [(e.tenant_id, e.actor_name, e.outcome) for e in events] == [
        (one.pk, user.username, "failed"),
        (two.pk, user.username, "failed"),
    ]


def test_login_failure_for_an_unknown_name_writes_nothing(client):
    TenantFactory()

    sign_in(client, "nobody-at-all", "wrong-password")

    assert AuditEvent.objects.count() == 0


def audited_actions(tenant) -> Counter:
    return Counter(AuditEvent.objects.filter(tenant=tenant).values_list("action", flat=True))


def test_login_five_failures_lock_the_account_out_with_429(client):
    tenant = TenantFactory()
    user = member(tenant, Role.VIEWER)

    statuses = [sign_in(client, user.username, "wrong-password").status_code for _ in range(5)]

    assert statuses == [200, 200, 200, 200, 429]
    assert audited_actions(tenant) == Counter({"auth.sign_in_failed": 5, "auth.locked_out": 1})


def test_login_while_locked_out_refuses_the_right_password_and_audits_it(client):
    tenant = TenantFactory()
    user = member(tenant, Role.VIEWER)
    for _ in range(5):
        sign_in(client, user.username, "wrong-password")

    locked = sign_in(client, user.username)

    assert locked.status_code == 429
    assert "Too many failed sign-ins" in locked.content.decode()
    assert SESSION_KEY not in client.session
    assert audited_actions(tenant)["auth.locked_out"] == 2


def test_login_lockout_is_per_username(client):
    tenant = TenantFactory()
    locked, other = member(tenant, Role.VIEWER), member(tenant, Role.VIEWER)
    for _ in range(5):
        sign_in(client, locked.username, "wrong-password")

    response = sign_in(client, other.username)

    assert response.status_code == 302
    assert client.session[SESSION_KEY] == str(other.pk)


def test_login_next_to_another_host_is_not_followed(client):
    user = member(TenantFactory(), Role.VIEWER)

    response = sign_in(client, user.username, next="https://evil.example/steal")

    assert response.status_code == 302
    assert response["Location"] == "/"


def test_login_next_on_this_site_is_followed(client):
    user = member(TenantFactory(), Role.AUDITOR)

    response = sign_in(client, user.username, next="/audit/")

    assert response["Location"] == "/audit/"


def test_logout_by_post_ends_the_session(client):
    client.force_login(member(TenantFactory(), Role.VIEWER))

    response = client.post(LOGOUT)

    assert response.status_code == 302
    assert response["Location"] == "/login/"
    assert SESSION_KEY not in client.session
    assert client.get(QUEUE).status_code == 302


def test_logout_by_get_only_asks_to_confirm(client):
    client.force_login(member(TenantFactory(), Role.VIEWER))

    response = client.get(LOGOUT)

    assert response.status_code == 200
    assert 'method="post"' in response.content.decode()
    assert SESSION_KEY in client.session


# --- the tenant switcher ---------------------------------------------------------------------


def two_tenant_user():
    one, two = TenantFactory(), TenantFactory()
    user = member(one, Role.VIEWER)
    member(two, Role.APPROVER, username=user.username)
    return user, one, two


def test_switch_tenant_stores_the_tenant_and_follows_next(client):
    user, _, two = two_tenant_user()
    client.force_login(user)

    response = client.post(SWITCH, {"tenant": two.slug, "next": "/audit/?tool=x"})

    assert response.status_code == 302
    assert response["Location"] == "/audit/?tool=x"
    assert client.session["console_tenant"] == two.slug


def test_switch_tenant_is_shown_selected_in_the_switcher(client):
    user, _, two = two_tenant_user()
    client.force_login(user)

    client.post(SWITCH, {"tenant": two.slug})
    response = client.get(QUEUE)

    assert f'<option value="{two.slug}" selected>' in response.content.decode()


def test_switch_tenant_to_all_clears_the_choice(client):
    user, one, _ = two_tenant_user()
    client.force_login(user)
    client.post(SWITCH, {"tenant": one.slug})

    response = client.post(SWITCH, {"tenant": ""})

    assert response["Location"] == QUEUE
    assert client.session["console_tenant"] == ""


def test_switch_tenant_the_user_is_not_in_is_400(client):
    user, one, _ = two_tenant_user()
    foreign = TenantFactory()
    client.force_login(user)
    client.post(SWITCH, {"tenant": one.slug})

    response = client.post(SWITCH, {"tenant": foreign.slug})

    assert response.status_code == 400
    assert response.content.decode() == "You are not a member of that tenant."
    assert client.session["console_tenant"] == one.slug


def test_switch_tenant_next_to_another_host_is_not_followed(client):
    user, one, _ = two_tenant_user()
    client.force_login(user)

    response = client.post(SWITCH, {"tenant": one.slug, "next": "//evil.example/"})

    assert response.status_code == 302
    assert response["Location"] == QUEUE


def test_switch_tenant_get_is_refused(client):
    user, _, _ = two_tenant_user()
    client.force_login(user)

    response = client.get(SWITCH)

    assert response.status_code == 405


# --- security headers ------------------------------------------------------------------------


@pytest.mark.parametrize("path", [LOGIN, QUEUE, "/no/such/page/"])
def test_security_headers_are_sent_on_console_pages(client, path):
    client.force_login(member(TenantFactory(), Role.VIEWER))

    response = client.get(path)

    assert response["Content-Security-Policy"] == CONSOLE_CSP
    assert "script-src 'self';" in response["Content-Security-Policy"]
    assert response["X-Frame-Options"] == "DENY"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"
    assert response["Permissions-Policy"] == "camera=(), microphone=(), geolocation=()"


def test_security_headers_are_sent_on_the_lockout_page(client):
    user = member(TenantFactory(), Role.VIEWER)
    for _ in range(5):
        response = sign_in(client, user.username, "wrong-password")

    assert response.status_code == 429
    assert response["Content-Security-Policy"] == CONSOLE_CSP
    assert response["X-Frame-Options"] == "DENY"


def test_security_headers_on_the_admin_allow_only_inline_styles(client):
    response = client.get("/admin/login/")

    assert response["Content-Security-Policy"] == ADMIN_CSP
    assert "script-src 'self';" in ADMIN_CSP


def test_console_pages_have_no_inline_script(client):
    # The CSP allows only scripts from /static/, so every <script> must load a file.
    client.force_login(member(TenantFactory(), Role.VIEWER))

    body = client.get(QUEUE).content.decode()

    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", body, flags=re.S)
    tags = re.findall(r"<script\b[^>]*>", body)
    assert scripts == [""] * len(tags)
    assert all(" src=" in tag for tag in tags)
