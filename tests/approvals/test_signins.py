"""Ending a person's sessions: the recorded ones and the others, audited in each tenant; and
removing a member or changing a role signs that person out everywhere, nobody else."""

from __future__ import annotations

import pytest
from allauth.usersessions.models import UserSession
from django.contrib.sessions.models import Session
from django.core.management import call_command
from django.test import Client

from approvals import signins, tenancy
from approvals.models import AuditEvent, Role
from tests.support import TenantFactory, member, signed_in

pytestmark = pytest.mark.django_db


def signed_out(client: Client) -> bool:
    """The client's next page sends it to the sign-in form."""
    response = client.get("/")
    return response.status_code == 302 and response["Location"].startswith("/login/")


def ended_events(tenant) -> list[dict]:
    return [
        {"actor": e.actor_name, **e.detail}
        for e in AuditEvent.objects.filter(tenant=tenant, action="auth.sessions_ended").order_by(
            "id"
        )
    ]


def test_end_sessions_keeps_the_named_session_and_ends_the_others():
    tenant, other = TenantFactory(), TenantFactory()
    user = member(tenant, Role.APPROVER, username="ana")
    member(other, Role.VIEWER, username="ana")
    here, laptop, phone = signed_in(user), signed_in(user), signed_in(user)
    # A session allauth never recorded (made before it was installed): ended too.
    old = Client()
    old.force_login(user)
    keep = here.session.session_key

    ended = signins.end_sessions(
        user=user, keep_session_key=keep, reason="signed out the other sessions", actor=user
    )

    assert ended == 3
    assert [signed_out(c) for c in (here, laptop, phone, old)] == [False, True, True, True]
    assert list(UserSession.objects.filter(user=user).values_list("session_key", flat=True)) == [
        keep
    ]
    expected = {
        "actor": "ana",
        "sessions": 3,
        "user": "ana",
        "user_id": user.pk,
        "reason": "signed out the other sessions",
    }
    assert ended_events(tenant) == [expected]
    assert ended_events(other) == [expected]


def test_end_sessions_leaves_other_people_signed_in_and_audits_nothing_when_none_ended():
    tenant = TenantFactory()
    ana, bo = member(tenant, username="ana"), member(tenant, username="bo")
    bos = signed_in(bo)

    assert signins.end_sessions(user=ana, reason="test", actor=None) == 0

    assert signed_out(bos) is False
    assert ended_events(tenant) == []
    assert Session.objects.count() == 1


def test_remove_member_signs_the_member_out_and_nobody_else(django_capture_on_commit_callbacks):
    tenant = TenantFactory()
    admin = member(tenant, Role.ADMIN, username="root")
    leaver = member(tenant, Role.APPROVER, username="leaver")
    stayer = member(tenant, Role.APPROVER, username="stayer")
    admins, leavers, stayers = signed_in(admin), signed_in(leaver), signed_in(stayer)

    with django_capture_on_commit_callbacks(execute=True):
        tenancy.remove_member(tenant=tenant, user=leaver, actor=admin)

    assert [signed_out(c) for c in (admins, leavers, stayers)] == [False, True, False]
    assert ended_events(tenant) == [
        {
            "actor": "root",
            "sessions": 1,
            "user": "leaver",
            "user_id": leaver.pk,
            "reason": f"removed from {tenant.slug}",
        }
    ]


def test_set_role_signs_the_member_out(django_capture_on_commit_callbacks):
    tenant = TenantFactory()
    admin = member(tenant, Role.ADMIN, username="root")
    changed = member(tenant, Role.APPROVER, username="changed")
    other = member(tenant, Role.APPROVER, username="other")
    changeds, others = signed_in(changed), signed_in(other)

    with django_capture_on_commit_callbacks(execute=True):
        tenancy.set_role(tenant=tenant, user=changed, role=Role.VIEWER, actor=admin)

    assert [signed_out(c) for c in (changeds, others)] == [True, False]
    assert [e["reason"] for e in ended_events(tenant)] == [f"role changed in {tenant.slug}"]


def test_set_role_to_the_same_role_signs_nobody_out(django_capture_on_commit_callbacks):
    tenant = TenantFactory()
    member(tenant, Role.ADMIN)
    same = member(tenant, Role.APPROVER)
    client = signed_in(same)

    with django_capture_on_commit_callbacks(execute=True):
        tenancy.set_role(tenant=tenant, user=same, role=Role.APPROVER)

    assert signed_out(client) is False
    assert ended_events(tenant) == []


def test_a_refused_removal_signs_nobody_out(django_capture_on_commit_callbacks):
    tenant = TenantFactory()
    last = member(tenant, Role.ADMIN)
    client = signed_in(last)

    with (
        django_capture_on_commit_callbacks(execute=True),
        pytest.raises(tenancy.TenancyConflictError),
    ):
        tenancy.remove_member(tenant=tenant, user=last)

    assert signed_out(client) is False


def test_remove_member_command_signs_the_member_out(django_capture_on_commit_callbacks):
    tenant = TenantFactory()
    member(tenant, Role.ADMIN)
    leaver = member(tenant, Role.VIEWER, username="cmd-leaver")
    client = signed_in(leaver)

    with django_capture_on_commit_callbacks(execute=True):
        call_command("remove_member", tenant=tenant.slug, user="cmd-leaver")

    assert signed_out(client) is True
    assert [e["actor"] for e in ended_events(tenant)] == ["system"]


def test_end_sessions_with_only_session_keys_ends_just_those():
    tenant = TenantFactory()
    user = member(tenant, Role.VIEWER)
    here, phone = signed_in(user), signed_in(user)
    old = Client()
    old.force_login(user)

    ended = signins.end_sessions(
        user=user, only_session_keys=[phone.session.session_key], reason="signed out a session"
    )

    assert ended == 1
    assert [signed_out(c) for c in (here, phone, old)] == [False, True, False]


def test_an_admin_who_changes_their_own_role_on_the_team_page_is_signed_out(
    django_capture_on_commit_callbacks,
):
    tenant = TenantFactory()
    member(tenant, Role.ADMIN, username="other-admin")
    admin = member(tenant, Role.ADMIN, username="self-demoter")
    client = signed_in(admin)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            f"/team/members/{admin.pk}/role/", {"tenant": tenant.slug, "role": Role.APPROVER}
        )

    assert response.status_code == 302
    assert signed_out(client) is True
    assert [e["user"] for e in ended_events(tenant)] == ["self-demoter"]
