"""The policies pages (admins only) and what the ticket page says about a ticket's policy."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from approvals.decisions.decide import decide
from approvals.models import (
    ApprovalPolicy,
    ApproverGroup,
    AuditEvent,
    Role,
    Ticket,
    TicketStatus,
    TicketVote,
)
from approvals.policies import versions
from approvals.policies.groups import save_group
from approvals.policies.versions import PolicyError, check_groups_exist, save_policy
from approvals.runs.reaper import reap
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db

LIST = reverse("approvals:policies")
EDIT = reverse("approvals:policy-edit")
GROUPS = reverse("approvals:groups")


@pytest.fixture
def world():
    tenant = TenantFactory(slug="acme", name="Acme Corp")
    return {
        "tenant": tenant,
        "admin": member(tenant, Role.ADMIN, username="boss"),
        "requester": member(tenant, Role.VIEWER, username="req"),
        "alice": member(tenant, Role.APPROVER, username="alice"),
        "bob": member(tenant, Role.APPROVER, username="bob"),
    }


def form(**overrides) -> dict:
    data = {
        "tenant": "acme",
        "agent": "",
        "tool": "deploy_release",
        "required_approvals": "2",
        "group_rules": "",
        "expiry_minutes": "",
        "on_expiry": "expire",
        "expiry_message": "",
        "escalation_group": "",
        "escalation_minutes": "",
        "auto_rules": "",
    }
    data.update(overrides)
    return data


def ticket_for(world) -> Ticket:
    return Ticket.objects.get(run=paused_run(world["tenant"], requested_by=world["requester"]))


# --- the policies pages ---------------------------------------------------------------------


def test_policies_admin_sees_the_page_linked_in_the_nav(client, world):
    client.force_login(world["admin"])

    response = client.get(LIST)

    assert response.status_code == 200
    text = response.content.decode()
    assert f'href="{LIST}"' in text
    assert "Approval policies · Acme Corp" in text
    assert 'data-scope="default"' in text


def test_policies_admin_saves_two_approvals_as_a_new_version_each_time(client, world):
    client.force_login(world["admin"])

    first = client.post(EDIT, form())
    second = client.post(EDIT, form(required_approvals="3", expiry_minutes="30"))

    assert first.status_code == 302
    assert second.status_code == 302
    versions = ApprovalPolicy.objects.filter(tool_name="deploy_release").order_by("version")
    assert [(p.version, p.required_approvals, p.expiry_seconds) for p in versions] == [
        (1, 2, None),
        (2, 3, 1800),
    ]
    assert versions[1].created_by == world["admin"]
    assert AuditEvent.objects.filter(action="policy.changed").count() == 2
    page = client.get(second.url).content.decode()
    assert 'data-version="2"' in page
    assert 'data-version="1"' in page
    assert "v1</strong> by boss" in page


def test_policies_saving_the_same_values_again_writes_no_version_and_keeps_approvals(client, world):
    client.force_login(world["admin"])
    client.post(EDIT, form())
    ticket = Ticket.objects.get(run=paused_run(world["tenant"], requested_by=world["requester"]))
    decide(ticket, user=world["alice"], approve=True)

    again = client.post(EDIT, form())

    assert again.status_code == 302
    assert ApprovalPolicy.objects.filter(tool_name="deploy_release").count() == 1
    assert AuditEvent.objects.filter(action="policy.changed").count() == 1
    assert TicketVote.objects.filter(ticket=ticket, invalidated_at__isnull=True).count() == 1
    page = client.get(again.url).content.decode()
    assert "Nothing changed: any agent / deploy_release stays at v1." in page


def test_policies_edit_page_starts_from_the_current_version(client, world):
    save_policy(
        tenant=world["tenant"],
        user=world["admin"],
        tool_name="deploy_release",
        required_approvals=4,
    )
    client.force_login(world["admin"])

    response = client.get(EDIT, {"tenant": "acme", "agent": "", "tool": "deploy_release"})

    assert response.status_code == 200
    assert response.context["form"].initial["required_approvals"] == 4


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"required_approvals": "0"}, "required_approvals", "greater than or equal to 1"),
        ({"required_approvals": "11"}, "required_approvals", "less than or equal to 10"),
        ({"group_rules": "1 ghosts"}, "group_rules", "There is no group called &#x27;ghosts&#x27;"),
        ({"group_rules": "many ghosts"}, "group_rules", "COUNT GROUP"),
        (
            {"auto_rules": "approve if release matches ([ because broken"},
            "auto_rules",
            "not a valid regular expression",
        ),
        ({"auto_rules": "approve whenever"}, "auto_rules", "Line 1"),
        ({"on_expiry": "escalate"}, "escalation_group", "Choose the group to escalate to"),
        ({"on_expiry": "explode"}, "on_expiry", "Select a valid choice"),
        ({"tool": "rm_rf"}, "tool", "Select a valid choice"),
    ],
)
def test_policies_form_errors_are_shown_and_nothing_is_saved(
    client, world, overrides, field, message
):
    client.force_login(world["admin"])

    response = client.post(EDIT, form(**overrides))

    assert response.status_code == 400
    assert field in response.context["form"].errors
    assert message in response.content.decode()
    assert ApprovalPolicy.objects.count() == 0


def test_policies_pages_are_404_for_non_admins(client, world):
    for user in (world["alice"], world["requester"]):
        client.force_login(user)
        assert client.get(LIST).status_code == 404
        assert client.get(EDIT, {"tenant": "acme"}).status_code == 404
        assert client.post(EDIT, form()).status_code == 404
        assert client.get(GROUPS, {"tenant": "acme"}).status_code == 404
        assert client.post(GROUPS, {"tenant": "acme", "name": "x"}).status_code == 404
    assert ApprovalPolicy.objects.count() == 0
    assert ApproverGroup.objects.count() == 0


def test_policies_pages_are_404_for_another_tenants_admin(client, world):
    other = TenantFactory(slug="globex")
    client.force_login(member(other, Role.ADMIN, username="globex-admin"))

    assert client.get(LIST, {"tenant": "acme"}).status_code == 404
    assert client.post(EDIT, form()).status_code == 404
    assert client.post(GROUPS, {"tenant": "acme", "name": "x"}).status_code == 404
    assert "Acme" not in client.get(LIST).content.decode()


def test_policies_nav_link_is_hidden_from_non_admins(client, world):
    client.force_login(world["alice"])

    assert f'href="{LIST}"' not in client.get(reverse("approvals:queue")).content.decode()


def test_groups_admin_creates_a_group_and_uses_it_in_a_rule(client, world):
    client.force_login(world["admin"])

    response = client.post(
        GROUPS, {"tenant": "acme", "name": "release managers", "members": ["alice", "bob"]}
    )
    saved = client.post(EDIT, form(group_rules="1 release managers"))

    assert response.status_code == 302
    group = ApproverGroup.objects.get(name="release managers")
    assert sorted(group.members.values_list("username", flat=True)) == ["alice", "bob"]
    assert saved.status_code == 302
    assert ApprovalPolicy.objects.get().group_rules == [{"group": "release managers", "count": 1}]
    assert "release managers" in client.get(LIST).content.decode()


def test_groups_refuse_someone_outside_the_tenant(client, world):
    outsider = member(TenantFactory(slug="globex"), Role.APPROVER, username="outsider")
    client.force_login(world["admin"])

    response = client.post(
        GROUPS, {"tenant": "acme", "name": "leads", "members": [outsider.username]}
    )

    assert response.status_code == 400
    assert ApproverGroup.objects.count() == 0


def test_policies_get_only_views_refuse_other_methods(client, world):
    client.force_login(world["admin"])

    assert client.post(LIST).status_code == 405


# --- the ticket page ------------------------------------------------------------------------


def test_ticket_page_shows_quorum_progress_and_policy_version(client, world):
    save_policy(
        tenant=world["tenant"],
        user=world["admin"],
        tool_name="deploy_release",
        required_approvals=2,
    )
    ticket = ticket_for(world)
    client.force_login(world["alice"])

    response = client.post(reverse("approvals:decide", args=[ticket.pk]), {"decision": "approve"})

    assert response.status_code == 302
    assert response.url == reverse("approvals:ticket", args=[ticket.pk])
    page = client.get(response.url).content.decode()
    assert "Your approval is recorded: 1 of 2 approvals: alice." in page
    assert 'id="quorum-progress"><strong>1 of 2 approvals: alice</strong>' in page
    assert 'id="ticket-policy">v1 · any agent / deploy_release' in page
    assert 'id="already-voted"' in page
    again = client.post(reverse("approvals:decide", args=[ticket.pk]), {"decision": "approve"})
    assert again.status_code == 409
    assert "You already approved this ticket" in again.content.decode()
    assert TicketVote.objects.filter(ticket=ticket).count() == 1

    client.force_login(world["bob"])
    done = client.post(reverse("approvals:decide", args=[ticket.pk]), {"decision": "approve"})

    assert done.url == reverse("approvals:run", args=[ticket.run_id])
    page = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()
    assert "Approved by alice, bob." in page


def test_ticket_page_explains_invalidated_approvals(client, world):
    save_policy(
        tenant=world["tenant"],
        user=world["admin"],
        tool_name="deploy_release",
        required_approvals=2,
    )
    ticket = ticket_for(world)
    decide(ticket, user=world["alice"], approve=True)
    save_policy(
        tenant=world["tenant"],
        user=world["admin"],
        tool_name="deploy_release",
        required_approvals=3,
    )
    client.force_login(world["bob"])

    page = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()

    assert (
        "1 approval (alice) given under policy v1 were invalidated when boss changed the policy "
        "to v2 at "
    ) in page
    assert "Approve again." in page
    assert "0 of 3 approvals" in page


def test_ticket_page_names_the_groups_a_member_is_not_in(client, world):
    group = ApproverGroup.objects.create(tenant=world["tenant"], name="release managers")
    group.members.add(world["alice"])
    save_policy(
        tenant=world["tenant"],
        user=world["admin"],
        tool_name="deploy_release",
        allowed_groups=["release managers"],
    )
    ticket = ticket_for(world)
    client.force_login(world["bob"])

    page = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()
    refused = client.post(reverse("approvals:decide", args=[ticket.pk]), {"decision": "approve"})

    assert "Only members of release managers may decide this ticket." in page
    assert 'id="decide-form"' not in page
    assert refused.status_code == 403
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING


def test_ticket_page_shows_an_automatic_approval_with_its_rule(client, world):
    save_policy(
        tenant=world["tenant"],
        user=world["admin"],
        tool_name="deploy_release",
        auto_rules=[
            {
                "argument": "environment",
                "op": "ne",
                "value": "production",
                "decision": "approve",
                "reason": "staging is low risk",
            }
        ],
    )
    ticket = Ticket.objects.get(
        run=paused_run(
            world["tenant"],
            requested_by=world["requester"],
            prompt="Deploy release 2026.07.25 to staging",
        )
    )
    client.force_login(world["alice"])

    page = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()

    assert (
        escape("automatically by rule approve if environment != production: staging is low risk")
        in page
    )


def test_ticket_page_shows_the_escalation(client, world):
    group = ApproverGroup.objects.create(tenant=world["tenant"], name="on-call leads")
    group.members.add(world["bob"])
    save_policy(
        tenant=world["tenant"],
        user=world["admin"],
        tool_name="deploy_release",
        on_expiry="escalate",
        escalation_group="on-call leads",
    )
    ticket = ticket_for(world)
    Ticket.objects.filter(pk=ticket.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    reap()
    client.force_login(world["alice"])

    page = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()

    assert 'id="ticket-escalated">to on-call leads at' in page
    assert "This ticket was escalated; only members of on-call leads may decide it now." in page


# --- deleting a group -----------------------------------------------------------------------

DELETE_GROUP = reverse("approvals:group-delete")


def _group(world, name: str) -> ApproverGroup:
    return save_group(
        tenant=world["tenant"], user=world["admin"], name=name, members=[world["alice"]]
    )


def test_groups_delete_an_unused_group_with_its_memberships_audited(client, world):
    _group(world, "relase managers")  # the typo nobody can use
    client.force_login(world["admin"])

    page = client.get(GROUPS, {"tenant": "acme", "name": "relase managers"}).content.decode()
    response = client.post(DELETE_GROUP, {"tenant": "acme", "name": "relase managers"}, follow=True)

    assert 'id="group-delete"' in page and "Delete relase managers" in page
    assert response.redirect_chain == [(f"{GROUPS}?tenant=acme", 302)]
    assert "Deleted the group relase managers." in response.content.decode()
    assert ApproverGroup.objects.count() == 0
    assert world["alice"].approver_groups.count() == 0
    deleted = AuditEvent.objects.get(action="group.deleted")
    assert (deleted.actor_id, deleted.detail) == (
        world["admin"].pk,
        {"group": "relase managers", "removed": ["alice"]},
    )


@pytest.mark.parametrize(
    "values",
    [
        {"group_rules": [{"group": "release managers", "count": 1}]},
        {"allowed_groups": ["release managers"]},
        {"on_expiry": "escalate", "escalation_group": "release managers"},
    ],
    ids=["rule", "who-may-decide", "escalation"],
)
def test_groups_delete_refuses_a_group_a_current_policy_names(client, world, values):
    _group(world, "release managers")
    save_policy(tenant=world["tenant"], user=world["admin"], tool_name="deploy_release", **values)
    client.force_login(world["admin"])

    response = client.post(
        DELETE_GROUP, {"tenant": "acme", "name": "release managers"}, follow=True
    )

    page = response.content.decode()
    assert response.status_code == 200
    assert (
        "Not deleted: the group release managers is named by any agent / deploy_release v1; "
        "change those policies first, then delete it." in page
    )
    assert ApproverGroup.objects.filter(name="release managers").exists()
    assert not AuditEvent.objects.filter(action="group.deleted").exists()


def test_groups_delete_is_allowed_once_the_policy_stops_naming_it(client, world):
    _group(world, "release managers")
    scope = {"tenant": world["tenant"], "user": world["admin"], "tool_name": "deploy_release"}
    save_policy(**scope, allowed_groups=["release managers"])
    save_policy(**scope, required_approvals=2)  # v2 names no group; v1 is history
    client.force_login(world["admin"])

    client.post(DELETE_GROUP, {"tenant": "acme", "name": "release managers"})

    assert ApproverGroup.objects.count() == 0


def test_groups_delete_of_a_missing_group_says_so(client, world):
    client.force_login(world["admin"])

    response = client.post(DELETE_GROUP, {"tenant": "acme", "name": "nobody"}, follow=True)

    assert response.status_code == 200
    assert "Not deleted: there is no group &#x27;nobody&#x27;." in response.content.decode()


def test_groups_delete_is_404_for_non_admins_and_405_for_get(client, world):
    _group(world, "release managers")
    for user in (world["alice"], member(TenantFactory(slug="globex"), Role.ADMIN)):
        client.force_login(user)
        assert (
            client.post(DELETE_GROUP, {"tenant": "acme", "name": "release managers"}).status_code
            == 404
        )
    client.force_login(world["admin"])
    assert (
        client.get(DELETE_GROUP, {"tenant": "acme", "name": "release managers"}).status_code == 405
    )
    assert ApproverGroup.objects.count() == 1


def test_save_policy_rechecks_groups_under_the_lock(world, monkeypatch):
    """A group deleted between the first check and the lock is still refused."""
    _group(world, "release managers")
    checks = []
    real = check_groups_exist

    def check_then_delete(tenant, named):
        checks.append(sorted(named))
        real(tenant, named)
        if len(checks) == 1:
            ApproverGroup.objects.filter(name="release managers").delete()

    monkeypatch.setattr(versions, "check_groups_exist", check_then_delete)

    with pytest.raises(PolicyError, match="no such group: release managers"):
        save_policy(
            tenant=world["tenant"],
            user=world["admin"],
            tool_name="deploy_release",
            allowed_groups=["release managers"],
        )
    assert len(checks) == 2
    assert ApprovalPolicy.objects.count() == 0


# --- removing a policy ----------------------------------------------------------------------

REMOVE = reverse("approvals:policy-remove")


def test_policy_remove_from_the_edit_page(client, world):
    save_policy(
        tenant=world["tenant"],
        user=world["admin"],
        tool_name="deploy_release",
        required_approvals=2,
    )
    client.force_login(world["admin"])
    edit = {"tenant": "acme", "agent": "", "tool": "deploy_release"}

    before = client.get(EDIT, edit).content.decode()
    response = client.post(REMOVE, edit, follow=True)

    page = response.content.decode()
    assert 'id="policy-remove"' in before
    assert response.status_code == 200
    assert (
        "Removed the policy for any agent / deploy_release. Its pending tickets now follow the "
        "built-in default (one approval by anyone who may decide)" in page
    )
    assert 'data-version="2" data-retired' in page
    assert 'id="policy-remove"' not in page
    assert 'data-scope="/deploy_release"' not in client.get(LIST).content.decode()


def test_policy_remove_without_a_policy_says_so(client, world):
    client.force_login(world["admin"])

    response = client.post(
        REMOVE, {"tenant": "acme", "agent": "", "tool": "deploy_release"}, follow=True
    )

    assert response.status_code == 200
    assert (
        "Not removed: any agent / deploy_release has no policy of its own to remove."
        in response.content.decode()
    )
    assert ApprovalPolicy.objects.count() == 0


def test_policy_remove_is_404_for_non_admins_and_405_for_get(client, world):
    save_policy(
        tenant=world["tenant"],
        user=world["admin"],
        tool_name="deploy_release",
        required_approvals=2,
    )
    data = {"tenant": "acme", "agent": "", "tool": "deploy_release"}
    for user in (world["alice"], member(TenantFactory(slug="globex"), Role.ADMIN)):
        client.force_login(user)
        assert client.post(REMOVE, data).status_code == 404
    client.force_login(world["admin"])
    assert client.get(REMOVE, data).status_code == 405
    assert ApprovalPolicy.objects.filter(retired=True).count() == 0


def test_group_delete_and_policy_remove_answer_bad_input_without_a_500(client, world):
    client.force_login(world["admin"])

    bad_group = client.post(DELETE_GROUP, {"tenant": "acme", "name": "a\x00b"}, follow=True)
    bad_tool = client.post(REMOVE, {"tenant": "acme", "agent": "", "tool": "x\x00y"})
    bad_agent = client.post(REMOVE, {"tenant": "acme", "agent": "nobody", "tool": ""})

    assert bad_group.status_code == 200
    assert "Not deleted: name the group to delete." in bad_group.content.decode()
    assert (bad_tool.status_code, bad_agent.status_code) == (404, 404)


def test_policies_step_up_is_saved_from_the_form_and_shown(client, world):
    client.force_login(world["admin"])

    response = client.post(
        EDIT, form(step_up_minutes="10", step_up_rules="environment == production")
    )

    assert response.status_code == 302
    policy = ApprovalPolicy.objects.get(tool_name="deploy_release")
    assert policy.step_up_minutes == 10
    assert policy.step_up_rules == [{"argument": "environment", "op": "eq", "value": "production"}]
    listed = client.get(LIST).content.decode()
    assert 'within 10 min<br><span class="muted">when environment == production</span>' in listed
    edit = client.get(response.url).content.decode()
    assert (
        "An approval needs a second factor confirmed within 10 minutes when "
        "environment == production." in edit
    )
    assert "environment == production</textarea>" in edit


def test_policies_step_up_conditions_without_minutes_or_in_bad_syntax_are_refused(client, world):
    client.force_login(world["admin"])

    no_minutes = client.post(EDIT, form(step_up_rules="environment == production"))
    bad = client.post(EDIT, form(step_up_minutes="10", step_up_rules="production please"))

    assert no_minutes.status_code == bad.status_code == 400
    assert "Say within how many minutes, or clear the conditions." in no_minutes.content.decode()
    assert "Line 1: write &#x27;ARGUMENT OP VALUE&#x27;" in bad.content.decode()
    assert not ApprovalPolicy.objects.filter(tool_name="deploy_release").exists()
