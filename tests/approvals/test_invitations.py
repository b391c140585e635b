"""Invitations by email: sent by an admin, accepted once through the email's link, refused
when expired, used, revoked or tampered with, and audited."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils import timezone

from approvals import invitations, tenancy
from approvals.models import AuditEvent, Invitation, Membership, Role
from tests.support import TenantFactory, member

pytestmark = pytest.mark.django_db

INVITE = reverse("approvals:invite")
MEMBERS = reverse("approvals:members")
NEW_PASSWORD = "a-long-new-pass-2026"


@pytest.fixture
def world():
    tenant = TenantFactory(slug="acme", name="Acme Corp")
    return {
        "tenant": tenant,
        "admin": member(tenant, Role.ADMIN, username="boss"),
        "alice": member(tenant, Role.APPROVER, username="alice"),
        "other_admin": member(TenantFactory(slug="globex"), Role.ADMIN, username="globex-boss"),
    }


def link_in(mail) -> str:
    return re.search(r"https?://\S+/invitations/\S+/", mail.body).group(0)


def path_of(link: str) -> str:
    return "/" + link.split("/", 3)[3]


def invite(client, world, mailoutbox, email="new@example.com", role="approver") -> str:
    client.force_login(world["admin"])
    response = client.post(INVITE, {"tenant": "acme", "email": email, "role": role})
    assert response.status_code == 302
    client.logout()
    return path_of(link_in(mailoutbox[-1]))


def accept_form(username="newbie") -> dict:
    return {"username": username, "password": NEW_PASSWORD, "password_again": NEW_PASSWORD}


def later(monkeypatch, delta: timedelta) -> None:
    moved = timezone.now() + delta
    monkeypatch.setattr(timezone, "now", lambda: moved)


def test_invite_sends_one_email_with_a_link_and_lists_it_pending(client, world, mailoutbox):
    client.force_login(world["admin"])

    response = client.post(
        INVITE, {"tenant": "acme", "email": "new@example.com", "role": "approver"}
    )

    assert response.status_code == 302
    assert len(mailoutbox) == 1
    mail = mailoutbox[0]
    assert (mail.to, mail.subject) == (
        ["new@example.com"],
        "[Acme Corp] You are invited to the approval console",
    )
    assert "boss invites you to Acme Corp in the approval console, as approver." in mail.body
    token = link_in(mail).rstrip("/").rsplit("/", 1)[1]
    invitation = Invitation.objects.get()
    # Only the token's hash is stored.
    assert token not in (invitation.token_hash, invitation.email)
    assert (invitation.role, invitation.invited_by) == ("approver", world["admin"])
    assert invitation.expires_at - invitation.created_at == timedelta(days=7)
    event = AuditEvent.objects.get(action="invitation.sent")
    assert (event.actor_name, event.detail["email"], event.detail["role"]) == (
        "boss",
        "new@example.com",
        "approver",
    )
    page = client.get(response.url).content.decode()
    assert 'data-invitation="new@example.com"' in page
    assert "Invited new@example.com as approver" in page


def test_invite_a_bad_email_is_a_form_error(client, world, mailoutbox):
    client.force_login(world["admin"])

    response = client.post(INVITE, {"tenant": "acme", "email": "not-an-email", "role": "viewer"})

    assert response.status_code == 400
    assert "Enter a valid email address." in response.content.decode()
    assert (Invitation.objects.count(), len(mailoutbox)) == (0, 0)


def test_invite_twice_to_one_address_is_refused_while_pending(client, world, mailoutbox):
    invite(client, world, mailoutbox)
    client.force_login(world["admin"])

    response = client.post(INVITE, {"tenant": "acme", "email": "NEW@example.com", "role": "viewer"})

    assert response.status_code == 400
    assert "already has an invitation pending: revoke it to send a new one" in (
        response.content.decode()
    )
    assert Invitation.objects.count() == 1


def test_invitation_link_shows_the_tenant_and_role(client, world, mailoutbox):
    path = invite(client, world, mailoutbox)

    response = client.get(path)

    assert response.status_code == 200
    text = response.content.decode()
    assert "Join Acme Corp" in text
    assert "You are invited as <strong>approver</strong> by boss." in text


def test_invitation_accepted_makes_a_user_and_member_once(client, world, mailoutbox):
    path = invite(client, world, mailoutbox)

    response = client.post(path, accept_form())
    welcome = client.get(response.url).content.decode()
    client.logout()
    again = client.post(path, accept_form("second"))

    assert response.status_code == 302
    assert response.url == reverse("approvals:me")
    user = get_user_model().objects.get(username="newbie")
    assert (user.email, user.check_password(NEW_PASSWORD)) == ("new@example.com", True)
    assert Membership.objects.get(user=user).role == "approver"
    invitation = Invitation.objects.get()
    assert (invitation.accepted_by, invitation.accepted_at is not None) == (user, True)
    assert [e.action for e in AuditEvent.objects.filter(tenant=world["tenant"]).order_by("seq")][
        -3:
    ] == ["invitation.sent", "member.added", "invitation.accepted"]
    # Signed in as the new user straight away.
    assert "Welcome to Acme Corp: you are approver." in welcome
    assert again.status_code == 410
    assert "This invitation was already used" in again.content.decode()
    assert not get_user_model().objects.filter(username="second").exists()


def test_invitation_accepted_by_a_signed_in_user(client, world, mailoutbox):
    outsider = member(TenantFactory(slug="initech"), Role.VIEWER, username="olga")
    path = invite(client, world, mailoutbox, role="auditor")
    client.force_login(outsider)

    page = client.get(path)
    response = client.post(path, {})

    assert "You are signed in as <strong>olga</strong>" in page.content.decode()
    assert response.status_code == 302
    assert Membership.objects.get(user=outsider, tenant=world["tenant"]).role == "auditor"
    assert Invitation.objects.get().accepted_by == outsider


def test_invitation_expired_is_refused_and_says_what_to_do(client, world, mailoutbox, monkeypatch):
    path = invite(client, world, mailoutbox)
    later(monkeypatch, timedelta(days=7, seconds=1))

    page = client.get(path)
    response = client.post(path, accept_form())

    assert page.status_code == 410
    assert "This invitation expired on" in page.content.decode()
    assert "ask an admin of Acme Corp to invite you again" in page.content.decode()
    assert response.status_code == 410
    assert not get_user_model().objects.filter(username="newbie").exists()


def test_invitation_still_works_just_before_it_expires(client, world, mailoutbox, monkeypatch):
    path = invite(client, world, mailoutbox)
    later(monkeypatch, timedelta(days=6, hours=23))

    response = client.post(path, accept_form())

    assert response.status_code == 302
    assert Membership.objects.filter(user__username="newbie").exists()


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p[:-2] + ("A/" if p[-2] != "A" else "B/"),
        lambda p: p[:-6] + "/",
        lambda p: p[:-1] + "x/",
    ],
    ids=["one-character", "cut-short", "longer"],
)
def test_invitation_tampered_link_is_refused(client, world, mailoutbox, change):
    path = invite(client, world, mailoutbox)

    response = client.post(change(path), accept_form())

    assert response.status_code == 404
    assert "This invitation link is not valid" in response.content.decode()
    assert not get_user_model().objects.filter(username="newbie").exists()


def test_invitation_revoked_by_an_admin_stops_working(client, world, mailoutbox):
    path = invite(client, world, mailoutbox)
    invitation = Invitation.objects.get()
    client.force_login(world["admin"])

    revoked = client.post(
        reverse("approvals:invitation-revoke", args=[invitation.pk]), {"tenant": "acme"}
    )
    page = client.get(MEMBERS).content.decode()
    client.logout()
    response = client.post(path, accept_form())

    assert revoked.status_code == 302
    assert 'data-invitation="new@example.com"' not in page
    assert "Revoked the invitation of new@example.com" in page
    assert AuditEvent.objects.get(action="invitation.revoked").detail["email"] == "new@example.com"
    assert response.status_code == 410
    assert "This invitation was revoked by an admin of Acme Corp" in response.content.decode()


def test_invitation_revoke_by_another_tenants_admin_is_404(client, world, mailoutbox):
    invite(client, world, mailoutbox)
    client.force_login(world["other_admin"])

    response = client.post(
        reverse("approvals:invitation-revoke", args=[Invitation.objects.get().pk]),
        {"tenant": "globex"},
    )

    as_acme = client.post(
        reverse("approvals:invitation-revoke", args=[Invitation.objects.get().pk]),
        {"tenant": "acme"},
    )

    assert (response.status_code, as_acme.status_code) == (404, 404)
    assert Invitation.objects.get().revoked_at is None


def test_invitation_a_taken_username_or_weak_password_is_a_form_error(client, world, mailoutbox):
    path = invite(client, world, mailoutbox)

    taken = client.post(path, accept_form("alice"))
    weak = client.post(path, {"username": "newbie", "password": "123", "password_again": "123"})
    differ = client.post(path, {**accept_form(), "password_again": "other-" + NEW_PASSWORD})

    assert taken.status_code == 400
    assert "A user named &#x27;alice&#x27; already exists." in taken.content.decode()
    assert weak.status_code == 400
    assert "The password is refused" in weak.content.decode()
    assert differ.status_code == 400
    assert "The two passwords differ." in differ.content.decode()
    assert Invitation.objects.get().accepted_at is None
    assert not AuditEvent.objects.filter(action="invitation.accepted").exists()


def test_invite_refuses_an_address_a_member_has(world):
    world["alice"].email = "alice@example.com"
    world["alice"].save()

    with pytest.raises(tenancy.TenancyConflictError) as refused:
        invitations.invite(
            tenant=world["tenant"], email="Alice@example.com", role="viewer", actor=world["admin"]
        )

    assert refused.value.sentence() == "A member of acme already has the email Alice@example.com."


def test_invite_an_email_that_cannot_be_sent_keeps_the_invitation_and_shows_the_link(
    client, world, settings
):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 9, 1
    client.force_login(world["admin"])

    response = client.post(INVITE, {"tenant": "acme", "email": "new@example.com", "role": "viewer"})

    assert response.status_code == 201
    text = response.content.decode()
    assert "its email could not be sent" in text
    link = re.search(r'id="invite-link">([^<]+)<', text).group(1)
    assert client.get(path_of(link)).status_code == 200


def test_invitation_link_refuses_other_methods(client, world, mailoutbox):
    path = invite(client, world, mailoutbox)

    assert client.put(path).status_code == 405
    assert Invitation.objects.get().accepted_at is None
