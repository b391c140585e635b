"""Single sign-on through a real OpenID Connect provider on loopback (tests.accounts.oidc_provider):
who gets an account, the memberships groups give, tenants that require SSO, and the audit."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import requests
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from accounts import sso
from accounts.models import GroupGrant, GroupRole, TenantSignOn
from approvals import invitations
from approvals.models import AuditEvent, Membership, Role
from tests.support import PASSWORD, TenantFactory, member

pytestmark = pytest.mark.django_db

LOGIN = "/login/"
SSO_LOGIN = "/accounts/oidc/sso/login/"
User = get_user_model()


def round_trip(client: Client, url: str = SSO_LOGIN, data: dict | None = None):
    """Post to the console's SSO start, follow the provider's redirect in the real process,
    and come back to the callback: the console's last response."""
    start = client.post(url, data or {"process": "login"})
    assert start.status_code == 302, start.content[:500]
    authorize = start["Location"]
    assert authorize.startswith("http://127.0.0.1:"), authorize
    back = requests.get(authorize, allow_redirects=False, timeout=10)
    assert back.status_code == 302, back.text
    callback = urlsplit(back.headers["Location"])
    assert callback.path == "/accounts/oidc/sso/login/callback/"
    return client.get(f"{callback.path}?{callback.query}")


def events(tenant, action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(tenant=tenant, action=action).order_by("seq"))


@pytest.fixture
def acme():
    tenant = TenantFactory(slug="acme", name="Acme Corp")
    member(tenant, Role.ADMIN, username="boss")
    return tenant


def test_without_invitation_or_mapping_sign_up_is_refused_and_nothing_created(oidc_provider, acme):
    oidc_provider.set_user(sub="s-1", preferred_username="nina", groups=["unmapped"])
    users = User.objects.count()
    response = round_trip(Client())
    assert response.status_code == 403
    assert "ask an admin for an invitation" in response.content.decode().lower()
    assert User.objects.count() == users
    assert not SocialAccount.objects.exists()
    assert "_auth_user_id" not in Client().session


def test_a_mapped_group_gives_its_role_and_the_sign_in_is_audited(oidc_provider, acme):
    GroupRole.objects.create(tenant=acme, provider_id="sso", group="deployers", role=Role.APPROVER)
    GroupRole.objects.create(tenant=acme, provider_id="sso", group="staff", role=Role.VIEWER)
    oidc_provider.set_user(
        sub="s-2",
        preferred_username="nina",
        email="nina@example.com",
        groups=["staff", "deployers"],
    )
    client = Client()
    response = round_trip(client)
    assert response.status_code == 302
    user = User.objects.get(username="nina")
    assert int(client.session["_auth_user_id"]) == user.pk
    assert Membership.objects.get(tenant=acme, user=user).role == Role.APPROVER
    assert GroupGrant.objects.get(tenant=acme, user=user).groups == ["deployers", "staff"]
    added = events(acme, "member.added")[-1]
    assert added.detail["user"] == "nina" and added.detail["via"] == "sso"
    signed = events(acme, "auth.signed_in")
    assert [(e.actor_id, e.detail["method"], e.detail["provider"]) for e in signed] == [
        (user.pk, "sso", "sso")
    ]
    assert signed[0].detail["provider_name"] == "Test IdP"


def test_the_groups_claim_name_is_the_providers_setting(oidc_provider, acme, settings):
    oidc_provider.groups_claim = "roles"
    try:
        settings.SOCIALACCOUNT_PROVIDERS = {"openid_connect": {"APPS": [oidc_provider.app()]}}
        GroupRole.objects.create(tenant=acme, provider_id="sso", group="ops", role=Role.AUDITOR)
        oidc_provider.set_user(sub="s-3", preferred_username="otto", roles=["ops"], groups=[])
        round_trip(Client())
    finally:
        oidc_provider.groups_claim = "groups"
    assert Membership.objects.get(tenant=acme, user__username="otto").role == Role.AUDITOR


def test_group_changes_follow_for_mapped_memberships_only(oidc_provider, acme):
    globex = TenantFactory(slug="globex", name="Globex")
    member(globex, Role.ADMIN, username="gboss")
    GroupRole.objects.create(tenant=acme, provider_id="sso", group="deployers", role=Role.APPROVER)
    GroupRole.objects.create(tenant=acme, provider_id="sso", group="admins", role=Role.ADMIN)
    GroupRole.objects.create(tenant=globex, provider_id="sso", group="deployers", role=Role.VIEWER)
    oidc_provider.set_user(sub="s-4", preferred_username="pia", groups=["deployers"])
    round_trip(Client())
    pia = User.objects.get(username="pia")
    # An admin of globex makes her an auditor there by hand: no longer the mapping's.
    GroupGrant.objects.filter(tenant=globex, user=pia).delete()
    Membership.objects.filter(tenant=globex, user=pia).update(role=Role.AUDITOR)

    oidc_provider.set_user(sub="s-4", preferred_username="pia", groups=["admins"])
    round_trip(Client())
    assert Membership.objects.get(tenant=acme, user=pia).role == Role.ADMIN
    changed = events(acme, "member.role_changed")[-1]
    assert changed.detail == {"user": "pia", "from": "approver", "to": "admin", "via": "sso"}
    # globex: "deployers" is gone, but her membership there was given by hand.
    assert Membership.objects.get(tenant=globex, user=pia).role == Role.AUDITOR

    oidc_provider.set_user(sub="s-4", preferred_username="pia", groups=[])
    round_trip(Client())
    assert not Membership.objects.filter(tenant=acme, user=pia).exists()
    assert not GroupGrant.objects.filter(user=pia).exists()
    removed = events(acme, "member.removed")[-1]
    assert removed.detail["user"] == "pia" and removed.detail["via"] == "sso"
    assert Membership.objects.filter(tenant=globex, user=pia).exists()


def test_an_invitation_is_accepted_through_sso(oidc_provider, acme):
    sent = invitations.invite(
        tenant=acme,
        email="ivy@example.com",
        role=Role.APPROVER,
        actor=User.objects.get(username="boss"),
    )
    token = sent.link.rstrip("/").rsplit("/", 1)[-1]
    client = Client()
    page = client.get(reverse("approvals:invitation", args=[token]))
    assert f'action="{reverse("sso-invitation", args=["sso"])}"' in page.content.decode()
    assert "Sign in with Test IdP" in page.content.decode()
    oidc_provider.set_user(sub="s-5", preferred_username="ivy", email="ivy@corp.example")
    response = round_trip(
        client, reverse("sso-invitation", args=["sso"]), {"token": token, "process": "login"}
    )
    assert response.status_code == 302
    ivy = User.objects.get(username="ivy")
    assert Membership.objects.get(tenant=acme, user=ivy).role == Role.APPROVER
    assert not GroupGrant.objects.filter(user=ivy).exists()
    invitation = sent.invitation
    invitation.refresh_from_db()
    assert invitation.accepted_by == ivy
    accepted = events(acme, "invitation.accepted")[-1]
    assert accepted.detail["user"] == "ivy"
    assert events(acme, "member.added")[-1].detail["via"] == "sso"
    assert SocialAccount.objects.get(user=ivy).uid == "s-5"
    # Used once: the same link through SSO again makes nothing.
    again = Client()
    response = again.post(reverse("sso-invitation", args=["sso"]), {"token": token})
    assert response.status_code == 410


def test_a_used_invitation_in_the_session_refuses_and_is_audited(oidc_provider, acme):
    boss = User.objects.get(username="boss")
    sent = invitations.invite(tenant=acme, email="jo@example.com", role=Role.VIEWER, actor=boss)
    token = sent.link.rstrip("/").rsplit("/", 1)[-1]
    client = Client()
    start = client.post(reverse("sso-invitation", args=["sso"]), {"token": token})
    assert start.status_code == 302
    invitations.revoke(tenant=acme, pk=sent.invitation.pk, actor=boss)
    oidc_provider.set_user(sub="s-6", preferred_username="jo")
    back = requests.get(start["Location"], allow_redirects=False, timeout=10)
    callback = urlsplit(back.headers["Location"])
    response = client.get(f"{callback.path}?{callback.query}")
    assert response.status_code == 403
    assert not User.objects.filter(username="jo").exists()
    refused = events(acme, "auth.sign_in_refused")[-1]
    assert refused.actor_name == "jo" and refused.detail["provider"] == "sso"


def test_an_existing_local_user_is_not_taken_over(oidc_provider, acme):
    local = member(acme, Role.ADMIN, username="sam")
    local.email = "sam@example.com"
    local.save()
    GroupRole.objects.create(tenant=acme, provider_id="sso", group="staff", role=Role.VIEWER)
    oidc_provider.set_user(
        sub="s-7", preferred_username="sam", email="sam@example.com", groups=["staff"]
    )
    client = Client()
    round_trip(client)
    newcomer = User.objects.get(pk=client.session["_auth_user_id"])
    assert newcomer.pk != local.pk
    assert newcomer.username == "sam2" and newcomer.email == ""
    assert not SocialAccount.objects.filter(user=local).exists()
    assert Membership.objects.get(tenant=acme, user=local).role == Role.ADMIN
    assert Membership.objects.get(tenant=acme, user=newcomer).role == Role.VIEWER


def test_an_sso_required_tenant_refuses_a_password_and_allows_sso(oidc_provider, acme):
    TenantSignOn.objects.create(tenant=acme, provider_id="sso", required=True)
    GroupRole.objects.create(tenant=acme, provider_id="sso", group="staff", role=Role.VIEWER)
    member(acme, Role.APPROVER, username="pat")
    client = Client()
    response = client.post(LOGIN, {"login": "pat", "password": PASSWORD}, follow=True)
    assert "_auth_user_id" not in client.session
    assert "Sign in with Test IdP" in response.content.decode()
    assert "requires single sign-on" in response.content.decode()
    refused = events(acme, "auth.sign_in_refused")[-1]
    assert refused.actor.username == "pat" and refused.detail["method"] == "password"
    assert refused.detail["provider"] == "sso"

    oidc_provider.set_user(sub="s-8", preferred_username="quinn", groups=["staff"])
    client = Client()
    round_trip(client)
    quinn = User.objects.get(username="quinn")
    assert int(client.session["_auth_user_id"]) == quinn.pk
    # Signed in again through SSO: an existing account, allowed by the rule.
    client = Client()
    round_trip(client)
    assert int(client.session["_auth_user_id"]) == quinn.pk
    assert len([e for e in events(acme, "auth.signed_in") if e.actor_id == quinn.pk]) == 2


def test_a_superuser_may_still_use_a_password(oidc_provider, acme):
    TenantSignOn.objects.create(tenant=acme, provider_id="sso", required=True)
    root = member(acme, Role.ADMIN, username="root")
    root.is_superuser = True
    root.save()
    client = Client()
    client.post(LOGIN, {"login": "root", "password": PASSWORD})
    assert int(client.session["_auth_user_id"]) == root.pk


def test_requiring_sso_ends_members_password_sessions(oidc_provider, acme):
    boss = User.objects.get(username="boss")
    member(acme, Role.APPROVER, username="pat")
    pat = Client()
    pat.post(LOGIN, {"login": "pat", "password": PASSWORD})
    assert "_auth_user_id" in pat.session
    admin = Client()
    admin.post(LOGIN, {"login": "boss", "password": PASSWORD})
    changes = sso.set_sign_on(
        tenant=acme,
        provider_id="sso",
        required=True,
        actor=boss,
        keep_session_key=admin.session.session_key,
    )
    assert changes == ["provider none → sso", "SSO required on"]
    assert pat.get("/").status_code == 302  # signed out: back to the sign-in page
    assert admin.get("/").status_code == 200
    ended = [e for e in events(acme, "auth.sessions_ended") if e.detail["user"] == "pat"]
    assert len(ended) == 1 and ended[0].detail["sessions"] == 1
    assert events(acme, "auth.settings_changed")[-1].detail["changes"] == (
        "provider none → sso, SSO required on"
    )


def test_a_signed_in_local_user_links_their_provider_account_then_signs_in_with_it(
    oidc_provider, acme
):
    local = member(acme, Role.APPROVER, username="lee")
    client = Client()
    client.force_login(local)
    me = client.get(reverse("approvals:me")).content.decode()
    assert "Link Test IdP" in me
    oidc_provider.set_user(sub="s-9", preferred_username="lee.corp", email="lee@corp.example")
    round_trip(client, data={"process": "connect", "next": reverse("approvals:me")})
    assert SocialAccount.objects.get(uid="s-9").user == local
    assert User.objects.filter(username__startswith="lee").count() == 1
    assert "Test IdP</strong>: linked." in client.get(reverse("approvals:me")).content.decode()
    # Now that tenant may require SSO: the linked account signs in as lee.
    TenantSignOn.objects.create(tenant=acme, provider_id="sso", required=True)
    fresh = Client()
    round_trip(fresh)
    assert int(fresh.session["_auth_user_id"]) == local.pk


def test_an_sso_sign_in_with_another_provider_than_required_is_refused(
    oidc_provider, acme, settings
):
    TenantSignOn.objects.create(tenant=acme, provider_id="okta", required=True)
    GroupRole.objects.create(tenant=acme, provider_id="sso", group="staff", role=Role.VIEWER)
    oidc_provider.set_user(sub="s-10", preferred_username="ray", groups=["staff"])
    round_trip(Client())  # a new account: made a member by the mapping
    ray = User.objects.get(username="ray")
    client = Client()
    response = round_trip(client)
    assert "_auth_user_id" not in client.session
    assert response.status_code == 302
    refused = events(acme, "auth.sign_in_refused")[-1]
    assert refused.actor == ray and refused.detail["method"] == "sso"
