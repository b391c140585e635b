"""The Team pages: a tenant's members (admins only), a user's own page, and the group editor
offering only people who may decide."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils.html import escape

from approvals.models import ApproverGroup, AuditEvent, Membership, Role
from approvals.policies.groups import save_group
from approvals.policies.versions import PolicyError
from tests.support import TenantFactory, UserFactory, member, queries_for

pytestmark = pytest.mark.django_db

MEMBERS = reverse("approvals:members")
ADD = reverse("approvals:member-add")
ME = reverse("approvals:me")
GROUPS = reverse("approvals:groups")


def role_url(user) -> str:
    return reverse("approvals:member-role", args=[user.pk])


def remove_url(user) -> str:
    return reverse("approvals:member-remove", args=[user.pk])


@pytest.fixture
def world():
    tenant = TenantFactory(slug="acme", name="Acme Corp")
    other = TenantFactory(slug="globex", name="Globex")
    return {
        "tenant": tenant,
        "other": other,
        "admin": member(tenant, Role.ADMIN, username="boss"),
        "alice": member(tenant, Role.APPROVER, username="alice"),
        "vic": member(tenant, Role.VIEWER, username="vic"),
        "other_admin": member(other, Role.ADMIN, username="globex-boss"),
    }


def role_of(world, user) -> str | None:
    membership = Membership.objects.filter(tenant=world["tenant"], user=user).first()
    return membership.role if membership else None


# --- the members page -----------------------------------------------------------------------


def test_members_page_lists_members_with_role_groups_and_last_sign_in(client, world):
    group = ApproverGroup.objects.create(tenant=world["tenant"], name="release managers")
    group.members.add(world["alice"])
    client.force_login(world["admin"])

    response = client.get(MEMBERS)

    assert response.status_code == 200
    text = response.content.decode()
    assert "Team · Acme Corp" in text
    assert f'href="{MEMBERS}" aria-current="page"' in text
    assert text.count('<tr data-member="') == 3
    alice_row = text.split('data-member="alice"')[1].split("</tr>")[0]
    assert '<option value="approver" selected>' in alice_row
    assert "release managers" in alice_row
    assert "never" in alice_row
    assert "globex-boss" not in text
    assert f'href="{reverse("api:tokens")}"' in text


def test_members_admin_adds_an_existing_user_by_username(client, world):
    UserFactory(username="newbie")
    client.force_login(world["admin"])

    response = client.post(ADD, {"tenant": "acme", "user": "newbie", "role": "auditor"})

    assert response.status_code == 302
    membership = Membership.objects.get(tenant=world["tenant"], user__username="newbie")
    assert membership.role == "auditor"
    event = AuditEvent.objects.get(action="member.added")
    assert (event.actor_name, event.detail["user"], event.detail["role"]) == (
        "boss",
        "newbie",
        "auditor",
    )
    assert "Added newbie to Acme Corp as auditor." in client.get(response.url).content.decode()


def test_members_admin_adds_an_existing_user_by_email(client, world):
    UserFactory(username="nora", email="nora@example.com")
    client.force_login(world["admin"])

    response = client.post(ADD, {"tenant": "acme", "user": "Nora@example.com", "role": "viewer"})

    assert response.status_code == 302
    assert Membership.objects.get(tenant=world["tenant"], user__username="nora").role == "viewer"


def test_members_add_an_unknown_user_is_a_form_error(client, world):
    client.force_login(world["admin"])

    response = client.post(ADD, {"tenant": "acme", "user": "ghost", "role": "viewer"})

    assert response.status_code == 400
    assert escape("No user named 'ghost': invite them by email") in response.content.decode()
    assert not AuditEvent.objects.filter(action="member.added").exists()


def test_members_add_someone_already_a_member_is_a_form_error(client, world):
    client.force_login(world["admin"])

    response = client.post(ADD, {"tenant": "acme", "user": "alice", "role": "viewer"})

    assert response.status_code == 400
    assert "User alice is already an approver of acme." in response.content.decode()
    assert role_of(world, world["alice"]) == "approver"


def test_members_admin_changes_a_role_audited(client, world):
    client.force_login(world["admin"])

    response = client.post(role_url(world["vic"]), {"tenant": "acme", "role": "approver"})

    assert response.status_code == 302
    assert role_of(world, world["vic"]) == "approver"
    event = AuditEvent.objects.get(action="member.role_changed")
    assert event.detail == {"user": "vic", "from": "viewer", "to": "approver", "via": "console"}
    assert "vic is now approver." in client.get(response.url).content.decode()


def test_members_the_last_admin_cannot_lose_the_role(client, world):
    client.force_login(world["admin"])

    response = client.post(role_url(world["admin"]), {"tenant": "acme", "role": "viewer"})

    assert response.status_code == 302
    assert role_of(world, world["admin"]) == "admin"
    page = client.get(response.url).content.decode()
    assert "Not changed: User boss is the last admin of acme: make another member admin" in page


def test_members_remove_asks_first_then_removes_with_groups_audited(client, world):
    save_group(tenant=world["tenant"], user=world["admin"], name="leads", members=[world["alice"]])
    client.force_login(world["admin"])

    confirm = client.get(remove_url(world["alice"]), {"tenant": "acme"})
    response = client.post(remove_url(world["alice"]), {"tenant": "acme"})

    assert confirm.status_code == 200
    assert "Remove alice from Acme Corp?" in confirm.content.decode()
    assert "in the approver group leads" in confirm.content.decode()
    assert response.status_code == 302
    assert role_of(world, world["alice"]) is None
    assert ApproverGroup.objects.get(name="leads").members.count() == 0
    event = AuditEvent.objects.get(action="member.removed")
    assert event.detail == {
        "user": "alice",
        "role": "approver",
        "groups": ["leads"],
        "via": "console",
    }


def test_members_the_last_admin_cannot_be_removed(client, world):
    client.force_login(world["admin"])

    response = client.post(remove_url(world["admin"]), {"tenant": "acme"})

    assert response.status_code == 409
    assert "User boss is the last admin of acme: make another member admin first." in (
        response.content.decode()
    )
    assert role_of(world, world["admin"]) == "admin"
    assert not AuditEvent.objects.filter(action="member.removed").exists()


def test_members_changes_read_in_the_audit_history(client, world):
    UserFactory(username="newbie")
    client.force_login(world["admin"])
    client.post(ADD, {"tenant": "acme", "user": "newbie", "role": "viewer"})
    client.post(role_url(world["vic"]), {"tenant": "acme", "role": "auditor"})
    client.post(remove_url(world["vic"]), {"tenant": "acme"})

    page = client.get(reverse("approvals:audit")).content.decode()

    rows = page.split("<tbody>")[1]
    assert rows.count("<code>member.added</code>") == 1
    assert rows.count("<code>member.role_changed</code>") == 1
    assert rows.count("<code>member.removed</code>") == 1
    assert [e.actor_name for e in AuditEvent.objects.filter(action__startswith="member.")] == [
        "boss"
    ] * 3


@pytest.mark.parametrize("who", ["other_admin", "alice", "vic"])
def test_members_pages_are_404_to_other_tenants_admins_and_non_admins(client, world, who):
    client.force_login(world[who])
    tenant = {"tenant": "acme"}

    responses = [
        client.get(MEMBERS, tenant),
        client.post(ADD, {**tenant, "user": world[who].username, "role": "admin"}),
        client.post(role_url(world[who]), {**tenant, "role": "admin"}),
        client.post(role_url(world["admin"]), {**tenant, "role": "viewer"}),
        client.get(remove_url(world["admin"]), tenant),
        client.post(remove_url(world["admin"]), tenant),
        client.post(
            reverse("approvals:invite"), {**tenant, "email": "x@example.com", "role": "admin"}
        ),
    ]

    assert [r.status_code for r in responses] == [404] * len(responses)
    assert role_of(world, world["admin"]) == "admin"
    assert not AuditEvent.objects.filter(action__startswith="member.").exists()


def test_members_a_member_of_another_tenant_is_404(client, world):
    client.force_login(world["admin"])

    response = client.post(role_url(world["other_admin"]), {"tenant": "acme", "role": "viewer"})

    assert response.status_code == 404
    assert Membership.objects.get(user=world["other_admin"]).role == "admin"


def test_members_post_only_views_refuse_get(client, world):
    client.force_login(world["admin"])

    assert client.get(ADD, {"tenant": "acme"}).status_code == 405
    assert client.get(role_url(world["vic"]), {"tenant": "acme"}).status_code == 405
    assert client.get(reverse("approvals:invite"), {"tenant": "acme"}).status_code == 405
    assert client.get(reverse("approvals:invitation-revoke", args=[1])).status_code == 405
    assert client.post(MEMBERS, {"tenant": "acme"}).status_code == 405


def test_members_nav_shows_team_to_admins_only(client, world):
    client.force_login(world["admin"])
    admin_page = client.get(reverse("approvals:queue")).content.decode()
    client.force_login(world["alice"])
    approver_page = client.get(reverse("approvals:queue")).content.decode()

    assert f'<a href="{MEMBERS}" >Team</a>' in admin_page
    assert ">Team</a>" not in approver_page


# --- a user's own page ----------------------------------------------------------------------


def test_me_lists_tenants_roles_and_groups_linked_from_the_header(client, world):
    member(world["other"], Role.AUDITOR, username="alice")
    ApproverGroup.objects.create(tenant=world["tenant"], name="leads").members.add(world["alice"])
    client.force_login(world["alice"])

    response = client.get(ME)

    assert response.status_code == 200
    text = response.content.decode()
    assert f'<a class="whoami" href="{ME}"' in text
    acme = text.split('data-tenant="acme"')[1].split("</tr>")[0]
    globex = text.split('data-tenant="globex"')[1].split("</tr>")[0]
    assert ("Approver" in acme, "leads" in acme) == (True, True)
    assert ("Auditor" in globex, "leads" in globex) == (True, False)
    assert f'href="{MEMBERS}?tenant=acme"' not in text


def test_me_needs_sign_in(client):
    response = client.get(ME)

    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


# --- the group editor offers only people who may decide -------------------------------------


def test_groups_editor_offers_only_approvers_and_admins(client, world):
    member(world["tenant"], Role.AUDITOR, username="audrey")
    client.force_login(world["admin"])

    response = client.get(GROUPS, {"tenant": "acme"})

    offered = response.context["form"].fields["members"].choices
    assert offered == [("alice", "alice"), ("boss", "boss")]


def test_groups_editor_refuses_a_viewer_with_a_form_error(client, world):
    client.force_login(world["admin"])

    response = client.post(GROUPS, {"tenant": "acme", "name": "leads", "members": ["alice", "vic"]})

    assert response.status_code == 400
    assert response.context["form"].errors["members"] == [
        "Select a valid choice. vic is not one of the available choices."
    ]
    assert ApproverGroup.objects.count() == 0


def test_groups_rule_refuses_someone_who_may_not_decide(world):
    with pytest.raises(PolicyError) as refused:
        save_group(
            tenant=world["tenant"],
            user=world["admin"],
            name="leads",
            members=[world["alice"], world["vic"]],
        )

    assert refused.value.sentence() == (
        "Vic (viewer) may not decide tickets; a group holds only approvers and admins: change "
        "their role first."
    )
    assert ApproverGroup.objects.count() == 0


def test_members_page_queries_do_not_grow_with_members(client, world):
    client.force_login(world["admin"])
    few = queries_for(client, f"{MEMBERS}?tenant=acme")
    for n in range(3):
        user = member(world["tenant"], Role.APPROVER, username=f"extra{n}")
        ApproverGroup.objects.get_or_create(tenant=world["tenant"], name=f"g{n}")[0].members.add(
            user
        )
    UserFactory(username="invitee")

    many = queries_for(client, f"{MEMBERS}?tenant=acme")

    assert many == few
