"""The operator's tenant and member commands: create_tenant, add_member, remove_member,
set_role. Each calls approvals.tenancy; bad input is one line and a non-zero exit."""

from __future__ import annotations

import threading
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection

from approvals import tenancy
from approvals.audit.chain import verify_chain
from approvals.core.errors import DomainError
from approvals.decisions.decide import decide
from approvals.live import tail
from approvals.models import ApproverGroup, AuditEvent, Membership, Role, Tenant
from tests.support import (
    ORIGIN,
    TenantFactory,
    UserFactory,
    decision_hints,
    member,
    pending_ticket,
    session_cookie,
    socket,
)

pytestmark = pytest.mark.django_db

STRONG_PASSWORD = "plover-lantern-1947"


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def refusal(*args: str) -> str:
    with pytest.raises(CommandError) as refused:
        run(*args)
    message = str(refused.value)
    assert "\n" not in message
    return message


def events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("id"))


@pytest.fixture
def acme():
    tenant = TenantFactory(slug="acme")
    member(tenant, Role.ADMIN, username="ada")
    return tenant


# --- create_tenant ------------------------------------------------------------------------


def test_create_tenant_creates_the_row_and_starts_its_audit_chain():
    out = run("create_tenant", "--slug", "initech", "--name", "Initech")

    assert out == "tenant initech (Initech) created\n"
    tenant = Tenant.objects.get(slug="initech")
    assert tenant.name == "Initech"
    [event] = events("tenant.created")
    assert (event.tenant_id, event.seq, event.outcome, event.actor_name) == (
        tenant.pk,
        1,
        "created",
        "system",
    )
    assert event.detail == {"slug": "initech", "name": "Initech", "via": "command"}
    assert verify_chain(tenant).ok is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slug", "acme", "--name", "Again"], "A tenant 'acme' already exists."),
        (
            ["--slug", "not a slug", "--name", "X"],
            "The slug 'not a slug' may hold only letters, digits, hyphens and underscores.",
        ),
        (["--slug", " ", "--name", "X"], "Give the tenant a slug."),
        (["--slug", "x" * 65, "--name", "X"], "The slug is 65 characters; at most 64."),
        (["--slug", "initech", "--name", "  "], "Give the tenant a name."),
    ],
)
def test_create_tenant_refuses_bad_input_in_one_line(acme, args, message):
    assert refusal("create_tenant", *args) == message
    assert list(Tenant.objects.values_list("slug", flat=True)) == ["acme"]
    assert events("tenant.created") == []


# --- add_member ---------------------------------------------------------------------------


def test_add_member_adds_an_existing_user_with_the_role(acme):
    UserFactory(username="bob")

    out = run("add_member", "--tenant", "acme", "--user", "bob", "--role", "approver")

    assert out == "bob added to acme as approver\n"
    membership = Membership.objects.get(tenant=acme, user__username="bob")
    assert membership.role == Role.APPROVER
    [event] = events("member.added")
    assert (event.tenant_id, event.outcome) == (acme.pk, "added")
    assert event.detail == {
        "user": "bob",
        "role": "approver",
        "created_user": False,
        "via": "command",
    }
    assert verify_chain(acme).ok is True


def test_add_member_creates_the_user_with_the_password_from_the_environment(acme, monkeypatch):
    monkeypatch.setenv("NEW_MEMBER_PASSWORD", STRONG_PASSWORD)

    out = run(
        "add_member",
        "--tenant",
        "acme",
        "--user",
        "carol",
        "--email",
        "carol@example.com",
        "--create-user",
        "--password-from-env",
        "NEW_MEMBER_PASSWORD",
        "--role",
        "auditor",
    )

    assert out == "carol created and added to acme as auditor\n"
    carol = get_user_model().objects.get(username="carol")
    assert (carol.email, carol.check_password(STRONG_PASSWORD)) == ("carol@example.com", True)
    assert Membership.objects.get(tenant=acme, user=carol).role == Role.AUDITOR
    [event] = events("member.added")
    assert event.detail["created_user"] is True
    assert STRONG_PASSWORD not in str(event.detail)


def test_add_member_creates_a_user_without_a_password_who_cannot_sign_in(acme):
    run(
        "add_member",
        "--tenant",
        "acme",
        "--user",
        "deploy-bot",
        "--create-user",
        "--role",
        "viewer",
    )

    bot = get_user_model().objects.get(username="deploy-bot")
    assert bot.has_usable_password() is False
    assert Membership.objects.get(tenant=acme, user=bot).role == Role.VIEWER


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--tenant", "nowhere", "--user", "ada", "--role", "viewer"],
            "no tenant 'nowhere'",
        ),
        (
            ["--tenant", "acme", "--user", "ghost", "--role", "viewer"],
            "No user named 'ghost': add --create-user to create them.",
        ),
        (
            ["--tenant", "acme", "--user", "ada", "--role", "viewer"],
            "User ada is already an admin of acme.",
        ),
        (
            ["--tenant", "acme", "--user", "ada", "--role", "viewer", "--create-user"],
            "A user named 'ada' already exists.",
        ),
        (
            ["--tenant", "acme", "--user", "new", "--role", "owner", "--create-user"],
            "Unknown role 'owner'; the roles are viewer, approver, auditor, admin.",
        ),
        (
            ["--tenant", "acme", "--user", "new", "--role", "viewer", "--create-user"]
            + ["--email", "not-an-address"],
            "'not-an-address' is not an email address.",
        ),
        (
            ["--tenant", "acme", "--user", "new", "--role", "viewer", "--create-user"]
            + ["--password-from-env", "UNSET_PASSWORD_VARIABLE"],
            "The environment variable UNSET_PASSWORD_VARIABLE is not set.",
        ),
        (
            ["--tenant", "acme", "--user", "ada", "--role", "viewer"]
            + ["--password-from-env", "NEW_MEMBER_PASSWORD"],
            "--password-from-env sets the password of a user it creates: add --create-user",
        ),
    ],
)
def test_add_member_refuses_bad_input_in_one_line(acme, monkeypatch, args, message):
    monkeypatch.setenv("NEW_MEMBER_PASSWORD", STRONG_PASSWORD)
    monkeypatch.delenv("UNSET_PASSWORD_VARIABLE", raising=False)

    assert refusal("add_member", *args) == message
    assert list(get_user_model().objects.values_list("username", flat=True)) == ["ada"]
    assert Membership.objects.count() == 1
    assert events("member.added") == []


def test_add_member_refuses_a_weak_password_and_creates_nobody(acme, monkeypatch):
    monkeypatch.setenv("NEW_MEMBER_PASSWORD", "12345678")

    message = refusal(
        "add_member",
        *("--tenant", "acme", "--user", "weak", "--role", "viewer", "--create-user"),
        *("--password-from-env", "NEW_MEMBER_PASSWORD"),
    )

    assert message == (
        "The password is refused: This password is too common. This password is entirely numeric."
    )
    assert not get_user_model().objects.filter(username="weak").exists()


# --- remove_member ------------------------------------------------------------------------


def test_remove_member_deletes_the_membership_and_its_group_places(acme):
    bob = member(acme, Role.APPROVER, username="bob")
    other = TenantFactory(slug="globex")
    member(other, Role.APPROVER, username="bob")
    release = ApproverGroup.objects.create(tenant=acme, name="release managers")
    release.members.add(bob)
    elsewhere = ApproverGroup.objects.create(tenant=other, name="release managers")
    elsewhere.members.add(bob)

    out = run("remove_member", "--tenant", "acme", "--user", "bob")

    assert out == "bob removed from acme\n"
    assert list(Membership.objects.filter(user=bob).values_list("tenant__slug", flat=True)) == [
        "globex"
    ]
    assert list(release.members.all()) == []
    assert list(elsewhere.members.all()) == [bob]
    [event] = events("member.removed")
    assert (event.tenant_id, event.outcome) == (acme.pk, "removed")
    assert event.detail == {
        "user": "bob",
        "role": "approver",
        "groups": ["release managers"],
        "via": "command",
    }


def test_remove_member_refuses_the_last_admin(acme):
    member(acme, Role.APPROVER, username="bob")

    message = refusal("remove_member", "--tenant", "acme", "--user", "ada")

    assert message == "User ada is the last admin of acme: make another member admin first."
    assert Membership.objects.get(tenant=acme, user__username="ada").role == Role.ADMIN
    assert events("member.removed") == []


def test_remove_member_removes_an_admin_when_another_admin_stays(acme):
    member(acme, Role.ADMIN, username="bea")

    run("remove_member", "--tenant", "acme", "--user", "ada")

    assert list(Membership.objects.filter(tenant=acme).values_list("user__username", "role")) == [
        ("bea", "admin")
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "nowhere", "--user", "ada"], "no tenant 'nowhere'"),
        (["--tenant", "acme", "--user", "ghost"], "no user named 'ghost'"),
        (["--tenant", "acme", "--user", "gus"], "User gus is not a member of acme."),
    ],
)
def test_remove_member_refuses_bad_input_in_one_line(acme, args, message):
    member(TenantFactory(slug="globex"), Role.ADMIN, username="gus")

    assert refusal("remove_member", *args) == message
    assert Membership.objects.count() == 2
    assert events("member.removed") == []


@pytest.mark.django_db(transaction=True)
def test_remove_member_stops_the_members_open_socket_hearing_the_tenant(settings, monkeypatch):
    settings.APPROVALS_LIVE_POLL_SECONDS = 0.05
    monkeypatch.setattr(tail, "audit_tail", tail.AuditTail())
    acme = TenantFactory(slug="acme")
    member(acme, Role.ADMIN, username="ada")
    leaver = member(acme, Role.VIEWER, username="leaver")
    requester = member(acme, Role.VIEWER)
    approver = member(acme, Role.APPROVER)
    before, after = (pending_ticket(acme, requested_by=requester) for _ in range(2))
    cookie = session_cookie(leaver)

    async def scenario():
        await get_channel_layer().flush()
        communicator = socket(ORIGIN, cookie)
        connected, _ = await communicator.connect()
        assert connected
        try:
            await database_sync_to_async(decide)(before, user=approver, approve=True)
            heard = await decision_hints(communicator)
            await database_sync_to_async(run)(
                "remove_member", "--tenant", "acme", "--user", "leaver"
            )
            await database_sync_to_async(decide)(after, user=approver, approve=True)
            # Signed out everywhere, the socket closes, and hears nothing of the tenant first.
            closed = await communicator.receive_output(timeout=5)
            quiet = await communicator.receive_nothing(timeout=0.5)
            return heard, closed, quiet
        finally:
            await communicator.disconnect()

    heard, closed, quiet = async_to_sync(scenario)()

    assert f'data-ticket="{before.pk}"' in heard["ticket.decided"]
    assert closed == {"type": "websocket.close", "code": 4401}
    assert quiet is True
    assert not Membership.objects.filter(user=leaver).exists()


# --- set_role -----------------------------------------------------------------------------


def test_set_role_changes_the_role_and_audits_it(acme):
    member(acme, Role.VIEWER, username="bob")

    out = run("set_role", "--tenant", "acme", "--user", "bob", "--role", "approver")

    assert out == "bob's role in acme is now approver (was viewer)\n"
    assert Membership.objects.get(tenant=acme, user__username="bob").role == Role.APPROVER
    [event] = events("member.role_changed")
    assert (event.outcome, event.detail) == (
        "changed",
        {"user": "bob", "from": "viewer", "to": "approver", "via": "command"},
    )
    assert verify_chain(acme).ok is True


def test_set_role_to_the_same_role_changes_nothing(acme):
    out = run("set_role", "--tenant", "acme", "--user", "ada", "--role", "admin")

    assert out == "ada's role in acme is already admin; nothing changed\n"
    assert events("member.role_changed") == []


def test_set_role_refuses_to_demote_the_last_admin(acme):
    message = refusal("set_role", "--tenant", "acme", "--user", "ada", "--role", "approver")

    assert message == "User ada is the last admin of acme: make another member admin first."
    assert Membership.objects.get(tenant=acme, user__username="ada").role == Role.ADMIN
    assert events("member.role_changed") == []


def test_set_role_demotes_an_admin_once_another_is_admin(acme):
    member(acme, Role.APPROVER, username="bea")
    run("set_role", "--tenant", "acme", "--user", "bea", "--role", "admin")

    run("set_role", "--tenant", "acme", "--user", "ada", "--role", "auditor")

    assert dict(Membership.objects.filter(tenant=acme).values_list("user__username", "role")) == {
        "ada": "auditor",
        "bea": "admin",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--tenant", "acme", "--user", "ada", "--role", "owner"],
            "Unknown role 'owner'; the roles are viewer, approver, auditor, admin.",
        ),
        (["--tenant", "nowhere", "--user", "ada", "--role", "viewer"], "no tenant 'nowhere'"),
        (["--tenant", "acme", "--user", "ghost", "--role", "viewer"], "no user named 'ghost'"),
        (
            ["--tenant", "acme", "--user", "gus", "--role", "viewer"],
            "User gus is not a member of acme.",
        ),
    ],
)
def test_set_role_refuses_bad_input_in_one_line(acme, args, message):
    UserFactory(username="gus")

    assert refusal("set_role", *args) == message
    assert Membership.objects.get(tenant=acme, user__username="ada").role == Role.ADMIN


# --- the process: exit code and the one line --------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["create_tenant", "--slug", "acme", "--name", "Again"],
            "CommandError: A tenant 'acme' already exists.",
        ),
        (
            ["set_role", "--tenant", "acme", "--user", "ada", "--role", "owner"],
            "CommandError: Unknown role 'owner'; the roles are viewer, approver, auditor, admin.",
        ),
        (
            ["remove_member", "--tenant", "acme", "--user", "ada"],
            "CommandError: User ada is the last admin of acme: make another member admin first.",
        ),
    ],
)
def test_bad_input_exits_non_zero_with_one_line(manage_process, args, line):
    member(TenantFactory(slug="acme"), Role.ADMIN, username="ada")

    process = manage_process(*args)
    out, err = process.communicate(timeout=120)

    assert (process.returncode, out, err.strip().splitlines()) == (1, "", [line])
    assert Membership.objects.get(user__username="ada").role == Role.ADMIN


# --- two changes at once ------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_admins_removed_at_the_same_moment_leave_one_admin():
    """Two threads, two connections, one barrier: the tenant's lock orders the removals, and the
    second finds the remaining admin is the last."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no row locks: two writers at once is a PostgreSQL question")
    acme = TenantFactory(slug="acme")
    admins = [member(acme, Role.ADMIN, username=name) for name in ("ada", "bea")]
    barrier = threading.Barrier(len(admins))
    results: dict[str, str] = {}

    def remove(user) -> None:
        try:
            barrier.wait(timeout=10)
            tenancy.remove_member(tenant=acme, user=user, channel="command")
            results[user.username] = "removed"
        except DomainError as error:
            results[user.username] = error.sentence()
        finally:
            connection.close()

    threads = [threading.Thread(target=remove, args=(user,)) for user in admins]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    [kept] = [name for name, result in results.items() if result != "removed"]
    assert sorted(results.values()) == [
        f"User {kept} is the last admin of acme: make another member admin first.",
        "removed",
    ]
    assert list(Membership.objects.filter(tenant=acme).values_list("user__username", "role")) == [
        (kept, "admin")
    ]
    assert len(events("member.removed")) == 1
    assert verify_chain(acme).ok is True
