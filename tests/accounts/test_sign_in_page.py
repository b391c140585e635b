"""The Team's Sign-in page: a tenant's admins choose the provider, require SSO, map groups to
roles and ask deciders for two-factor; everyone else gets 404."""

from __future__ import annotations

import pytest
from django.urls import reverse

from accounts.models import GroupRole, TenantSignOn
from approvals.models import AuditEvent, Role
from tests.support import TenantFactory, member

pytestmark = pytest.mark.django_db

PAGE = reverse("sign-in-settings")
SAVE = reverse("sign-in-save")
MAP = reverse("sso-mapping-add")
UNMAP = reverse("sso-mapping-remove")


@pytest.fixture
def acme():
    return TenantFactory(slug="acme", name="Acme Corp")


@pytest.fixture
def admin(client, acme):
    user = member(acme, Role.ADMIN, username="boss")
    client.force_login(user)
    return user


def last(tenant, action: str) -> AuditEvent:
    return AuditEvent.objects.filter(tenant=tenant, action=action).latest("seq")


def test_only_admins_see_it(client, acme):
    client.force_login(member(acme, Role.APPROVER, username="alice"))
    assert client.get(PAGE, {"tenant": "acme"}).status_code == 404
    assert client.post(SAVE, {"tenant": "acme", "provider": ""}).status_code == 404
    assert client.post(MAP, {"tenant": "acme", "group": "x", "role": "admin"}).status_code == 404


def test_another_tenants_admin_gets_404(client, acme):
    other = TenantFactory(slug="globex")
    client.force_login(member(other, Role.ADMIN, username="gboss"))
    assert client.get(PAGE, {"tenant": "acme"}).status_code == 404
    assert client.post(SAVE, {"tenant": "acme", "provider": ""}).status_code == 404
    assert client.post(UNMAP, {"tenant": "acme", "mapping": "1"}).status_code == 404


def test_the_page_shows_the_settings_and_the_members_page_links_it(
    client, admin, oidc_provider, acme
):
    GroupRole.objects.create(tenant=acme, provider_id="sso", group="deployers", role=Role.APPROVER)
    page = client.get(PAGE, {"tenant": "acme"}).content.decode()
    assert "Test IdP" in page and 'data-group="deployers"' in page
    assert "break-glass" in page
    members = client.get(reverse("approvals:members"), {"tenant": "acme"}).content.decode()
    assert f'href="{PAGE}?tenant=acme"' in members


def test_without_providers_it_says_so(client, admin, settings):
    settings.SOCIALACCOUNT_PROVIDERS = {"openid_connect": {"APPS": []}}
    page = client.get(PAGE, {"tenant": "acme"}).content.decode()
    assert 'id="no-providers"' in page and 'id="add-mapping"' not in page


def test_saving_requires_sso_and_two_factor_and_audits(client, admin, oidc_provider, acme):
    response = client.post(
        SAVE,
        {"tenant": "acme", "provider": "sso", "required": "on", "deciders_need_two_factor": "on"},
    )
    assert response.status_code == 302
    sign_on = TenantSignOn.objects.get(tenant=acme)
    assert (sign_on.provider_id, sign_on.required, sign_on.updated_by) == ("sso", True, admin)
    acme.refresh_from_db()
    assert acme.deciders_need_two_factor is True
    changes = [
        e.detail["changes"]
        for e in AuditEvent.objects.filter(tenant=acme, action="auth.settings_changed")
    ]
    assert changes == ["provider none → sso, SSO required on", "deciders need two-factor on"]
    # The admin's own session was kept.
    assert client.get(PAGE, {"tenant": "acme"}).status_code == 200

    client.post(SAVE, {"tenant": "acme", "provider": ""})
    assert not TenantSignOn.objects.filter(tenant=acme).exists()
    acme.refresh_from_db()
    assert acme.deciders_need_two_factor is False


def test_required_without_a_provider_and_unknown_providers_are_form_errors(
    client, admin, oidc_provider, acme
):
    response = client.post(SAVE, {"tenant": "acme", "provider": "", "required": "on"})
    assert response.status_code == 400
    assert "Choose the provider members must sign in with." in response.content.decode()
    response = client.post(SAVE, {"tenant": "acme", "provider": "okta"})
    assert response.status_code == 400
    assert not TenantSignOn.objects.exists()
    assert not AuditEvent.objects.filter(action="auth.settings_changed").exists()


def test_groups_are_mapped_and_unmapped_with_audit(client, admin, oidc_provider, acme):
    response = client.post(
        MAP, {"tenant": "acme", "provider": "sso", "group": " deployers ", "role": "approver"}
    )
    assert response.status_code == 302
    mapping = GroupRole.objects.get(tenant=acme)
    assert (mapping.group, mapping.role) == ("deployers", "approver")
    assert last(acme, "auth.sso_role_mapped").detail == {
        "provider": "sso",
        "group": "deployers",
        "role": "approver",
    }
    again = client.post(
        MAP, {"tenant": "acme", "provider": "sso", "group": "deployers", "role": "admin"}
    )
    assert again.status_code == 400
    assert "mapped to approver already" in again.content.decode()
    empty = client.post(MAP, {"tenant": "acme", "provider": "sso", "group": "", "role": "admin"})
    assert empty.status_code == 400
    assert "Give the group&#x27;s name" in empty.content.decode()

    other = TenantFactory(slug="globex")
    foreign = GroupRole.objects.create(tenant=other, provider_id="sso", group="g", role="viewer")
    client.post(UNMAP, {"tenant": "acme", "mapping": foreign.pk})
    assert GroupRole.objects.filter(pk=foreign.pk).exists()
    client.post(UNMAP, {"tenant": "acme", "mapping": mapping.pk})
    assert not GroupRole.objects.filter(pk=mapping.pk).exists()
    assert last(acme, "auth.sso_role_unmapped").detail["group"] == "deployers"


def test_posting_views_refuse_get(client, admin):
    for url in (SAVE, MAP, UNMAP):
        assert client.get(url, {"tenant": "acme"}).status_code == 405
