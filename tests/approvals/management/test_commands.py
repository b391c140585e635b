"""Management commands: decide and rotate_keys, called in-process."""

from __future__ import annotations

import os
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django_tasks_db.models import DBTaskResult

from approvals.audit.chain import verify_chain
from approvals.models import AuditEvent, Run, RunStatus, Ticket, TicketStatus
from approvals.policies.versions import save_policy
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def pending():
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, "approver", username="ann")
    run = paused_run(tenant, requested_by=requester)
    return Ticket.objects.get(run=run)


# --- decide -------------------------------------------------------------------------------


def test_decide_approve_prints_a_line_and_queues_the_run(pending):
    member(pending.tenant, "approver", username="bob")
    out = StringIO()

    call_command("decide", str(pending.pk), "--approve", "--user", "bob", stdout=out)

    assert (
        out.getvalue() == f"ticket {pending.pk} approved by bob; run {pending.run_id} is queued\n"
    )
    pending.refresh_from_db()
    assert (pending.status, pending.decided_by.username) == (TicketStatus.APPROVED, "bob")
    assert Run.objects.get(pk=pending.run_id).status == RunStatus.QUEUED
    task = DBTaskResult.objects.get()
    assert (task.task_path, task.args_kwargs) == (
        "approvals.execution.queue.resume_run_task",
        {"args": [pending.run_id], "kwargs": {}},
    )


def test_decide_reject_stores_the_message(pending):
    member(pending.tenant, "approver", username="bob")
    out = StringIO()

    call_command(
        "decide",
        str(pending.pk),
        "--reject",
        "--user",
        "bob",
        "--message",
        "not on a Friday",
        stdout=out,
    )

    assert (
        out.getvalue() == f"ticket {pending.pk} rejected by bob; run {pending.run_id} is queued\n"
    )
    pending.refresh_from_db()
    assert (pending.status, pending.decision_message) == (TicketStatus.REJECTED, "not on a Friday")


def test_decide_of_an_approval_that_needs_a_second_factor_is_refused(pending):
    admin = member(pending.tenant, "admin", username="ada")
    member(pending.tenant, "approver", username="bob")
    save_policy(tenant=pending.tenant, user=admin, tool_name="deploy_release", step_up_minutes=10)

    with pytest.raises(CommandError, match="approve it from its ticket page"):
        call_command("decide", str(pending.pk), "--approve", "--user", "bob", stdout=StringIO())

    assert Ticket.objects.get(pk=pending.pk).status == TicketStatus.PENDING


def test_decide_unknown_ticket_is_a_command_error(pending):
    member(pending.tenant, "approver", username="bob")
    missing = Ticket.objects.order_by("-pk").first().pk + 1000

    with pytest.raises(CommandError) as excinfo:
        call_command("decide", str(missing), "--approve", "--user", "bob", stdout=StringIO())

    assert str(excinfo.value) == f"ticket {missing} does not exist"


def test_decide_unknown_user_is_a_command_error(pending):
    with pytest.raises(CommandError) as excinfo:
        call_command("decide", str(pending.pk), "--approve", "--user", "ghost", stdout=StringIO())

    assert str(excinfo.value) == "no user named 'ghost'"
    assert Ticket.objects.get(pk=pending.pk).status == TicketStatus.PENDING


def test_decide_self_approval_is_a_command_error(pending):
    with pytest.raises(CommandError) as excinfo:
        call_command("decide", str(pending.pk), "--approve", "--user", "ann", stdout=StringIO())

    assert str(excinfo.value) == "You requested this call, so someone else must approve it."
    assert Ticket.objects.get(pk=pending.pk).status == TicketStatus.PENDING


DIGEST_REFUSAL = (
    "Not approved: the arguments in the stored state differ from those recorded on the ticket."
)


def test_decide_refuses_a_ticket_whose_digest_does_not_verify(pending, client):
    """The digest gate is the service's: the command refuses as the page does, word for word."""
    member(pending.tenant, "approver", username="bob")
    Ticket.objects.filter(pk=pending.pk).update(arguments_digest="f" * 64)

    with pytest.raises(CommandError) as excinfo:
        call_command("decide", str(pending.pk), "--approve", "--user", "bob", stdout=StringIO())

    assert str(excinfo.value) == DIGEST_REFUSAL
    assert Ticket.objects.get(pk=pending.pk).status == TicketStatus.PENDING
    assert not DBTaskResult.objects.exists()
    client.force_login(get_user_model().objects.get(username="bob"))
    page = client.post(f"/tickets/{pending.pk}/decide/", {"decision": "approve"})
    assert page.status_code == 409
    assert DIGEST_REFUSAL in page.content.decode()


def test_decide_rejects_a_ticket_whose_digest_does_not_verify(pending):
    """Rejecting runs nothing, so it needs no verified call."""
    member(pending.tenant, "approver", username="bob")
    Ticket.objects.filter(pk=pending.pk).update(arguments_digest="f" * 64)

    call_command("decide", str(pending.pk), "--reject", "--user", "bob", stdout=StringIO())

    assert Ticket.objects.get(pk=pending.pk).status == TicketStatus.REJECTED


def test_decide_viewer_role_is_a_command_error(pending):
    member(pending.tenant, "viewer", username="vic")

    with pytest.raises(CommandError) as excinfo:
        call_command("decide", str(pending.pk), "--approve", "--user", "vic", stdout=StringIO())

    assert str(excinfo.value) == "The viewer role cannot decide tickets."
    assert Ticket.objects.get(pk=pending.pk).status == TicketStatus.PENDING


def test_decide_other_tenant_user_is_told_the_ticket_does_not_exist(pending):
    member(TenantFactory(slug="globex"), "approver", username="gus")

    with pytest.raises(CommandError) as excinfo:
        call_command("decide", str(pending.pk), "--approve", "--user", "gus", stdout=StringIO())

    assert str(excinfo.value) == f"ticket {pending.pk} does not exist for gus"


def test_decide_already_decided_names_who_decided(pending):
    member(pending.tenant, "approver", username="bob")
    member(pending.tenant, "approver", username="cat")
    call_command("decide", str(pending.pk), "--approve", "--user", "bob", stdout=StringIO())
    pending.refresh_from_db()

    with pytest.raises(CommandError) as excinfo:
        call_command("decide", str(pending.pk), "--reject", "--user", "cat", stdout=StringIO())

    assert str(excinfo.value) == (
        f"Already approved by bob at {pending.decided_at:%Y-%m-%d %H:%M:%S} UTC."
    )


def test_decide_without_a_choice_is_refused(pending):
    with pytest.raises(CommandError) as excinfo:
        call_command("decide", str(pending.pk), "--user", "ann", stdout=StringIO())

    assert str(excinfo.value) == ("Error: one of the arguments --approve --reject is required")


# --- rotate_keys ------------------------------------------------------------------------------


@pytest.fixture
def audit_ring(settings):
    settings.APPROVALS_AUDIT_KEYS = [("a1", b"1" * 32)]
    settings.APPROVALS_DECISION_SIGNING_KEYS = [("d1", b"d" * 32)]
    return settings


DECISION_LINE = (
    "decision keys: new decisions signed with {current}, nothing to re-sign; published: "
    "{published}. To rotate, put a new id:key first in APPROVALS_DECISION_SIGNING_KEYS and keep "
    "the old one after it."
)


def _audit_line() -> str:
    return (
        "audit chain: new events linked with key a1, nothing to re-hash; "
        f"events per key: a1 {AuditEvent.objects.count()}\n"
        + DECISION_LINE.format(current="d1", published="d1")
        + "\n"
    )


def test_rotate_keys_command_prints_its_counts(settings, audit_ring):
    k1, k2 = os.urandom(32), os.urandom(32)
    settings.APPROVALS_ENCRYPTION_KEYS = [("k1", k1)]
    tenant = TenantFactory()
    paused_run(tenant)
    paused_run(tenant, prompt="Deploy release 2026.07.25 to staging")
    settings.APPROVALS_ENCRYPTION_KEYS = [("k2", k2), ("k1", k1)]
    out = StringIO()

    call_command("rotate_keys", stdout=out, stderr=StringIO())

    assert out.getvalue() == (
        "primary key k2: 2 re-encrypted, 0 already current, 0 could not be opened\n" + _audit_line()
    )
    assert sorted(Run.objects.values_list("state_key_id", flat=True)) == ["k2", "k2"]


def test_rotate_keys_command_unopenable_run_exits_1(settings, audit_ring):
    settings.APPROVALS_ENCRYPTION_KEYS = [("k1", os.urandom(32))]
    paused_run(TenantFactory())
    settings.APPROVALS_ENCRYPTION_KEYS = [("k2", os.urandom(32))]
    out, err = StringIO(), StringIO()

    with pytest.raises(SystemExit) as excinfo:
        call_command("rotate_keys", stdout=out, stderr=err)

    assert excinfo.value.code == 1
    assert out.getvalue() == (
        "primary key k2: 0 re-encrypted, 0 already current, 1 could not be opened\n" + _audit_line()
    )
    assert err.getvalue() == "some states could not be opened with any key in the ring\n"


def test_rotate_keys_command_rehashes_no_audit_event_and_counts_them_per_key(settings):
    k1, k2 = os.urandom(32), os.urandom(32)
    settings.APPROVALS_ENCRYPTION_KEYS = [("k1", k1)]
    settings.APPROVALS_AUDIT_KEYS = [("a1", b"1" * 32)]
    tenant = TenantFactory(slug="acme")
    paused_run(tenant)
    before = list(AuditEvent.objects.order_by("pk").values_list("pk", "hash", "hash_key_id"))
    # Both rings rotated, as an operator would: the state is re-sealed (audited: keys.rotated).
    settings.APPROVALS_ENCRYPTION_KEYS = [("k2", k2), ("k1", k1)]
    settings.APPROVALS_AUDIT_KEYS = [("a2", b"2" * 32), ("a1", b"1" * 32)]
    settings.APPROVALS_DECISION_SIGNING_KEYS = [("d2", b"e" * 32), ("d1", b"d" * 32)]
    out = StringIO()

    call_command("rotate_keys", stdout=out, stderr=StringIO())

    # The old events are as they were; the rotation's own event is linked with the new key.
    after = list(AuditEvent.objects.order_by("pk").values_list("pk", "hash", "hash_key_id"))
    assert after[: len(before)] == before
    assert [key_id for _, _, key_id in after[len(before) :]] == ["a2"]
    assert out.getvalue().splitlines()[-2:] == [
        "audit chain: new events linked with key a2, nothing to re-hash; "
        f"events per key: a1 {len(before)}, a2 1",
        DECISION_LINE.format(current="d2", published="d2, d1"),
    ]
    assert verify_chain(tenant).ok


def test_rotate_keys_command_fails_when_a_key_with_events_left_the_audit_ring(settings):
    settings.APPROVALS_AUDIT_KEYS = [("a1", b"1" * 32)]
    paused_run(TenantFactory())
    linked = AuditEvent.objects.count()
    settings.APPROVALS_AUDIT_KEYS = [("a2", b"2" * 32)]
    err = StringIO()

    with pytest.raises(SystemExit) as excinfo:
        call_command("rotate_keys", stdout=StringIO(), stderr=err)

    assert excinfo.value.code == 1
    assert err.getvalue() == (
        f"{linked} audit events were linked with key 'a1', which is not in "
        "APPROVALS_AUDIT_KEYS: put it back, or verify_audit fails on them\n"
    )
