"""Two-factor through allauth's pages in the console's look: enrolling an authenticator app
with a code computed here, the sign-in's second step, recovery codes, and the audit of each."""

from __future__ import annotations

import re

import pytest
from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import SECRET_SESSION_KEY
from django.contrib.auth import SESSION_KEY
from django.urls import reverse

from accounts import audit
from approvals.models import AuditEvent, Role
from tests.support import (
    PASSWORD,
    TenantFactory,
    forget_used_totp_codes,
    give_totp,
    member,
    totp_code,
)

pytestmark = pytest.mark.django_db

LOGIN = reverse("account_login")
AUTHENTICATE = reverse("mfa_authenticate")


def sign_in_with_password(client, user):
    return client.post(LOGIN, {"login": user.get_username(), "password": PASSWORD})


def confirm_password(client):
    """allauth asks for the password again (within ACCOUNT_REAUTHENTICATION_TIMEOUT) before
    any change to a person's second factors."""
    response = client.post(reverse("account_reauthenticate"), {"password": PASSWORD})
    assert response.status_code == 302


def events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("tenant__slug", "seq"))


@pytest.fixture
def person():
    """An approver of two tenants: every event is written once in each."""
    user = member(TenantFactory(slug="acme"), Role.APPROVER, username="alice")
    member(TenantFactory(slug="beta"), Role.VIEWER, username="alice")
    return user


# --- enrolling -------------------------------------------------------------------------------


def test_changing_two_factor_asks_for_the_password_again_in_the_console_look(client, person):
    sign_in_with_password(client, person)

    redirect = client.get(reverse("mfa_activate_totp"))
    page = client.get(redirect["Location"])
    wrong = client.post(reverse("account_reauthenticate"), {"password": "wrong"})

    assert redirect["Location"].startswith(reverse("account_reauthenticate"))
    assert '<form class="account-form" method="post" action="/accounts/reauthenticate/">' in (
        page.content.decode()
    )
    assert wrong.status_code == 200
    assert 'class="field-error" role="alert"' in wrong.content.decode()


def test_activate_page_shows_the_qr_code_the_secret_and_the_code_field(client, person):
    sign_in_with_password(client, person)
    confirm_password(client)

    response = client.get(reverse("mfa_activate_totp"))

    body = response.content.decode()
    secret = client.session[SECRET_SESSION_KEY]
    assert response.status_code == 200
    assert re.search(r'<img src="data:image/svg\+xml;base64,[^"]+" class="qr"', body)
    assert f'value="{secret}" readonly' in body
    assert 'name="code"' in body and 'autocomplete="one-time-code"' in body
    assert "style=" not in body
    assert "<script>" not in body


def test_activate_with_the_apps_code_turns_totp_on_and_audits_it(
    client, person, django_capture_on_commit_callbacks
):
    sign_in_with_password(client, person)
    confirm_password(client)
    client.get(reverse("mfa_activate_totp"))
    secret = client.session[SECRET_SESSION_KEY]

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("mfa_activate_totp"), {"code": totp_code(secret)})

    assert response.status_code == 302
    types = set(Authenticator.objects.filter(user=person).values_list("type", flat=True))
    assert types == {"totp", "recovery_codes"}
    enrolled = [(e.tenant.slug, e.detail["type"], e.actor_id) for e in events("mfa.enrolled")]
    assert sorted(enrolled) == [
        ("acme", "recovery_codes", person.pk),
        ("acme", "totp", person.pk),
        ("beta", "recovery_codes", person.pk),
        ("beta", "totp", person.pk),
    ]


def test_activate_with_a_wrong_code_shows_the_error_and_adds_nothing(client, person):
    sign_in_with_password(client, person)
    confirm_password(client)
    client.get(reverse("mfa_activate_totp"))

    response = client.post(reverse("mfa_activate_totp"), {"code": "000000x"})

    body = response.content.decode()
    assert response.status_code == 200
    assert 'class="field-error" id="code-error" role="alert"' in body
    assert 'aria-invalid="true"' in body
    assert not Authenticator.objects.filter(user=person).exists()
    assert events("mfa.enrolled") == []


def test_two_factor_index_is_in_the_console_look(client, person):
    signed_in_with_totp(client, person)

    body = client.get(reverse("mfa_index")).content.decode()

    assert '<link rel="stylesheet" href="/static/console/accounts.css">' in body
    assert body.count('<section class="card account-panel" id="mfa-') == 3
    assert 'href="/accounts/2fa/totp/deactivate/"' in body
    assert 'href="/accounts/2fa/recovery-codes/"' in body


# --- signing in with a second factor ---------------------------------------------------------


def test_password_then_totp_signs_in_and_audits_both(client, person):
    secret, _ = give_totp(person)

    first = sign_in_with_password(client, person)
    stage = client.get(AUTHENTICATE)
    second = client.post(AUTHENTICATE, {"code": totp_code(secret)})

    assert first.status_code == 302 and first["Location"] == AUTHENTICATE
    assert 'id="mfa_webauthn_authenticate"' in stage.content.decode()
    assert second.status_code == 302
    assert client.session[SESSION_KEY] == str(person.pk)
    signed_in = [(e.tenant.slug, e.detail) for e in events("auth.signed_in")]
    assert signed_in == [
        ("acme", {"method": "password", "second_factor": "totp"}),
        ("beta", {"method": "password", "second_factor": "totp"}),
    ]


def test_a_wrong_totp_code_is_refused_and_audited(client, person):
    give_totp(person)
    sign_in_with_password(client, person)

    response = client.post(AUTHENTICATE, {"code": "123456"})

    body = response.content.decode()
    assert response.status_code == 200
    assert "Incorrect code." in body
    assert 'aria-invalid="true"' in body
    assert SESSION_KEY not in client.session
    failed = [(e.tenant.slug, e.detail, e.actor_id) for e in events("mfa.failed")]
    assert failed == [("acme", {"type": "totp"}, person.pk), ("beta", {"type": "totp"}, person.pk)]
    assert events("auth.signed_in") == []


def test_a_recovery_code_signs_in_and_audits_how_many_are_left(client, person):
    _, codes = give_totp(person)
    sign_in_with_password(client, person)

    response = client.post(AUTHENTICATE, {"code": codes[0]})

    assert response.status_code == 302
    assert client.session[SESSION_KEY] == str(person.pk)
    used = [(e.tenant.slug, e.detail) for e in events("mfa.recovery_code_used")]
    assert used == [("acme", {"left": len(codes) - 1}), ("beta", {"left": len(codes) - 1})]
    signed_in = events("auth.signed_in")[0]
    assert signed_in.detail == {"method": "password", "second_factor": "recovery_codes"}


def test_a_used_recovery_code_is_refused_the_second_time(client, person):
    _, codes = give_totp(person)
    sign_in_with_password(client, person)
    client.post(AUTHENTICATE, {"code": codes[0]})
    client.post(reverse("account_logout"))
    sign_in_with_password(client, person)

    response = client.post(AUTHENTICATE, {"code": codes[0]})

    assert response.status_code == 200
    assert SESSION_KEY not in client.session


def test_sign_in_without_two_factor_audits_none(client, person):
    sign_in_with_password(client, person)

    assert [e.detail for e in events("auth.signed_in")] == [
        {"method": "password", "second_factor": "none"},
        {"method": "password", "second_factor": "none"},
    ]


def test_sign_out_is_audited_in_each_tenant(client, person):
    sign_in_with_password(client, person)

    response = client.post(reverse("account_logout"))

    assert response.status_code == 302
    assert [(e.tenant.slug, e.actor_id) for e in events("auth.signed_out")] == [
        ("acme", person.pk),
        ("beta", person.pk),
    ]


def test_a_wrong_password_keeps_the_lockout_audit(client, person):
    client.post(LOGIN, {"login": "alice", "password": "wrong"})

    assert [e.tenant.slug for e in events("auth.sign_in_failed")] == ["acme", "beta"]
    assert events("auth.signed_in") == []


# --- recovery codes and turning it off -------------------------------------------------------


def signed_in_with_totp(client, user) -> str:
    secret, _ = give_totp(user)
    sign_in_with_password(client, user)
    client.post(AUTHENTICATE, {"code": totp_code(secret)})
    confirm_password(client)
    forget_used_totp_codes()
    return secret


def test_recovery_codes_are_shown_and_downloadable(client, person):
    signed_in_with_totp(client, person)
    codes = Authenticator.objects.get(user=person, type="recovery_codes").wrap()

    page = client.get(reverse("mfa_view_recovery_codes"))
    download = client.get(reverse("mfa_download_recovery_codes"))

    unused = codes.get_unused_codes()
    assert page.status_code == 200
    assert "\n".join(unused) in page.content.decode()
    assert 'class="button"' in page.content.decode()
    assert download.status_code == 200
    assert download["Content-Disposition"] == 'attachment; filename="recovery-codes.txt"'
    assert all(code in download.content.decode() for code in unused)


def test_regenerating_recovery_codes_is_audited(client, person, django_capture_on_commit_callbacks):
    signed_in_with_totp(client, person)
    before = Authenticator.objects.get(user=person, type="recovery_codes").wrap().generate_codes()

    page = client.get(reverse("mfa_generate_recovery_codes"))
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("mfa_generate_recovery_codes"))

    after = Authenticator.objects.get(user=person, type="recovery_codes").wrap().generate_codes()
    assert page.status_code == 200
    assert response.status_code == 302
    assert after != before
    assert [e.tenant.slug for e in events("mfa.recovery_codes_reset")] == ["acme", "beta"]


def test_deactivating_totp_removes_it_and_its_codes_and_audits_it(
    client, person, django_capture_on_commit_callbacks
):
    signed_in_with_totp(client, person)

    page = client.get(reverse("mfa_deactivate_totp"))
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("mfa_deactivate_totp"))

    assert page.status_code == 200
    assert 'class="button reject"' in page.content.decode()
    assert response.status_code == 302
    assert not Authenticator.objects.filter(user=person).exists()
    removed = sorted((e.tenant.slug, e.detail["type"]) for e in events("mfa.removed"))
    assert removed == [
        ("acme", "recovery_codes"),
        ("acme", "totp"),
        ("beta", "recovery_codes"),
        ("beta", "totp"),
    ]


# --- passkey pages (the ceremony itself is in tests/browser/test_passkeys.py) ----------------


def test_webauthn_add_page_has_its_scripts_as_files_and_data(client, person):
    signed_in_with_totp(client, person)

    body = client.get(reverse("mfa_add_webauthn")).content.decode()

    assert '<script src="/static/mfa/js/webauthn.js"></script>' in body
    assert '<script id="js_data" type="application/json">' in body
    assert 'data-allauth-onload="allauth.webauthn.forms.addForm" type="application/json"' in body
    assert 'id="id_passwordless"' in body
    assert 'id="mfa_webauthn_add"' in body


# --- the person's own page -------------------------------------------------------------------


def test_my_page_says_two_factor_is_off_and_links_to_set_it_up(client, person):
    client.force_login(person)

    body = client.get(reverse("approvals:me")).content.decode()

    assert '<span class="badge">Off</span>' in body
    assert 'href="/accounts/2fa/" id="two-factor-link">Set up two-factor</a>' in body
    assert 'href="/accounts/2fa/webauthn/add/" id="passkeys-link">Add a passkey</a>' in body


def test_my_page_says_two_factor_is_on_with_the_codes_left(client, person):
    give_totp(person)
    client.force_login(person)

    body = client.get(reverse("approvals:me")).content.decode()

    assert '<span class="badge status-approved">On</span>' in body
    assert "<dt>Recovery codes</dt><dd>10 left</dd>" in body


def test_my_page_names_the_tenants_that_ask_for_it(client, person):
    TenantFactory(slug="acme", deciders_need_two_factor=True)
    person.memberships.filter(tenant__slug="acme").update()
    acme = person.memberships.get(tenant__slug="acme").tenant
    acme.deciders_need_two_factor = True
    acme.save(update_fields=["deciders_need_two_factor"])
    client.force_login(person)

    body = client.get(reverse("approvals:me")).content.decode()

    assert 'id="two-factor-asked">Acme asks deciders for two-factor' in body


def test_the_totp_secret_is_stored_sealed(person):
    secret, _ = give_totp(person)

    stored = Authenticator.objects.get(user=person, type="totp").data["secret"]

    assert stored.startswith("sealed:")
    assert secret not in stored
    assert (
        Authenticator.objects.get(user=person, type="totp").wrap().validate_code(totp_code(secret))
    )


# --- how a sign-in is described --------------------------------------------------------------


def test_sign_in_detail_names_sso_with_its_provider_and_ignores_reauthentication():
    records = [
        {"method": "socialaccount", "at": 1.0, "provider": "okta", "uid": "u1"},
        {"method": "mfa", "at": 2.0, "type": "webauthn", "id": 3},
        {"method": "password", "at": 3.0, "reauthenticated": True},
    ]

    assert audit.sign_in_detail(records) == {
        "method": "sso",
        "provider": "okta",
        "second_factor": "webauthn",
    }


def test_sign_in_detail_names_a_passkey_sign_in_without_a_second_factor():
    records = [{"method": "mfa", "at": 1.0, "type": "webauthn", "id": 3, "passwordless": True}]

    assert audit.sign_in_detail(records) == {"method": "passkey", "second_factor": "none"}
