"""Pre-authorisations, by their own functions: the live hints each use sends, and what a use
records."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.decisions import preauth
from approvals.decisions.edit import edit_and_approve
from approvals.models import Membership, PreAuthorization, Role, Run, Ticket, TicketStatus
from approvals.policies.versions import save_policy
from approvals.runs.resume import resume
from devtools import demo
from tests.support import TenantFactory, member, paused_run

pytestmark = pytest.mark.django_db

EDITED = {"environment": "production", "release": "2026.07.25"}


@pytest.fixture(autouse=True)
def model_calls(monkeypatch) -> dict[str, int]:
    monkeypatch.setitem(demo.MODEL_CALLS, "release", 0)
    return demo.MODEL_CALLS


@pytest.fixture
def hints(monkeypatch) -> list[tuple[int, str, dict]]:
    """The live hints sent (by every module: they share one), as (tenant, kind, data)."""
    sent: list[tuple[int, str, dict]] = []
    monkeypatch.setattr(
        preauth.hints,
        "notify_on_commit",
        lambda tenant_id, kind, **data: sent.append((tenant_id, kind, data)),
    )
    return sent


@pytest.fixture
def setup():
    tenant = TenantFactory()
    requester = member(tenant, Role.VIEWER, username="requester")
    approver = member(tenant, Role.APPROVER, username="approver")
    run = paused_run(tenant, requested_by=requester)
    return tenant, Ticket.objects.get(run=run), approver


def test_approve_hints_the_decided_ticket_to_its_tenant(setup, hints):
    tenant, ticket, approver = setup
    edit_and_approve(ticket, user=approver, arguments=EDITED)
    hints.clear()

    resume(run_id=ticket.run_id, worker_id="w1")

    new = Ticket.objects.get(run_id=ticket.run_id, generation=2)
    assert new.status == TicketStatus.APPROVED
    assert [h for h in hints if h[1] == "ticket.decided"] == [
        (
            tenant.pk,
            "ticket.decided",
            {"ticket": new.pk, "run": ticket.run_id, "status": TicketStatus.APPROVED},
        )
    ]


def test_count_as_vote_hints_the_changed_ticket_to_its_tenant(setup, hints):
    tenant, ticket, approver = setup
    admin = member(tenant, Role.ADMIN, username="admin")
    save_policy(tenant=tenant, user=admin, tool_name="deploy_release", required_approvals=2)
    ticket.refresh_from_db()
    edit_and_approve(ticket, user=approver, arguments=EDITED)
    hints.clear()

    resume(run_id=ticket.run_id, worker_id="w1")

    run = Run.objects.get(pk=ticket.run_id)
    new = Ticket.objects.get(run=run, generation=2)
    assert new.status == TicketStatus.PENDING
    assert [h for h in hints if h[1] == "ticket.changed"] == [
        (tenant.pk, "ticket.changed", {"ticket": new.pk, "run": run.pk})
    ]


def second_call(ticket: Ticket, pre, *, call_id: str = "call_again") -> Ticket:
    """The model's new call with exactly the pre-authorised arguments: a pending ticket."""
    return Ticket.objects.create(
        run_id=ticket.run_id,
        tenant_id=ticket.tenant_id,
        generation=2,
        tool_name=pre.tool_name,
        tool_call_id=call_id,
        arguments_json=pre.arguments_json,
        arguments_digest=pre.arguments_digest,
        requested_by=ticket.requested_by,
        expires_at=pre.expires_at,
    )


def test_approve_decides_that_ticket_only_and_says_so_on_it(setup):
    tenant, ticket, approver = setup
    elsewhere = Ticket.objects.get(run=paused_run(TenantFactory()))
    pre = edit_and_approve(ticket, user=approver, arguments=EDITED)
    new = second_call(ticket, pre)
    now = timezone.now()

    preauth.approve(Run.objects.get(pk=ticket.run_id), new, pre, now=now)

    message = f"Pre-authorised by approver: edited from ticket #{ticket.pk}."
    stored = Ticket.objects.get(pk=new.pk)
    assert (stored.status, stored.decided_by, stored.decided_at, stored.decision_message) == (
        TicketStatus.APPROVED,
        approver,
        now,
        message,
    )
    # The caller goes on with the same object: it says what the row says.
    assert (new.status, new.decided_by, new.decided_at, new.decision_message) == (
        TicketStatus.APPROVED,
        approver,
        now,
        message,
    )
    assert Ticket.objects.get(pk=elsewhere.pk).status == TicketStatus.PENDING


def test_approve_of_a_ticket_past_its_expiry_is_refused(setup, hints):
    _, ticket, approver = setup
    pre = edit_and_approve(ticket, user=approver, arguments=EDITED)
    new = second_call(ticket, pre)
    hints.clear()

    with pytest.raises(RuntimeError) as raised:
        preauth.approve(
            Run.objects.get(pk=ticket.run_id),
            new,
            pre,
            now=new.expires_at + timedelta(seconds=1),
        )

    assert str(raised.value) == f"ticket {new.pk} was decided while it was being created"
    assert Ticket.objects.get(pk=new.pk).status == TicketStatus.PENDING
    assert hints == []


def test_use_spends_that_pre_authorisation_only_and_records_when(setup):
    tenant, ticket, approver = setup
    other = Ticket.objects.get(run=paused_run(tenant, requested_by=ticket.requested_by))
    pre = edit_and_approve(ticket, user=approver, arguments=EDITED)
    other_pre = edit_and_approve(other, user=approver, arguments=EDITED)
    new = second_call(ticket, pre)
    now = timezone.now()

    assert preauth.use(pre, new, now=now) is True

    stored = PreAuthorization.objects.get(pk=pre.pk)
    assert (stored.used_by_id, stored.used_at) == (new.pk, now)
    assert (pre.used_by, pre.used_at) == (new, now)
    assert PreAuthorization.objects.get(pk=other_pre.pk).used_by_id is None


def test_changes_hide_by_the_leafs_name_not_its_parents():
    """Only the changed field's own name decides: a plain field under a secret-named object
    shows, a secret-named field under a plain one, quoted in brackets, hides."""
    rows = preauth.changes(
        {"token": {"region": "eu"}, "config": {"api-key": "old"}},
        {"token": {"region": "us"}, "config": {"api-key": "new"}},
    )

    assert rows == [
        {
            "path": 'config["api-key"]',
            "kind": "changed",
            "before": "[redacted]",
            "after": "[redacted]",
        },
        {"path": "token.region", "kind": "changed", "before": '"eu"', "after": '"us"'},
    ]


def test_changes_of_an_added_secret_show_no_value_before_and_hide_the_one_after():
    rows = preauth.changes({"n": 1}, {"n": 1, "password": "hunter2"})

    assert rows == [{"path": "password", "kind": "added", "before": "", "after": "[redacted]"}]


def test_changes_of_a_removed_secret_hide_the_value_before_and_show_none_after():
    rows = preauth.changes({"n": 1, "password": "hunter2"}, {"n": 1})

    assert rows == [{"path": "password", "kind": "removed", "before": "[redacted]", "after": ""}]


def test_changes_read_the_leafs_whole_name():
    """SECRETX is one word, not "secret": the name is read as written, nothing trimmed off."""
    rows = preauth.changes({"SECRETX": 1}, {"SECRETX": 2})

    assert rows == [{"path": "SECRETX", "kind": "changed", "before": "1", "after": "2"}]


def test_candidate_is_only_of_the_same_run_and_tool(setup):
    tenant, ticket, approver = setup
    pre = edit_and_approve(ticket, user=approver, arguments=EDITED)
    other_run = paused_run(tenant, requested_by=ticket.requested_by)
    now = timezone.now()
    same_call_elsewhere = second_call(Ticket.objects.get(run=other_run), pre)
    other_tool = second_call(ticket, pre, call_id="call_other_tool")
    Ticket.objects.filter(pk=other_tool.pk).update(tool_name="publish_invoice")
    other_tool.refresh_from_db()

    assert preauth.candidate(other_run, same_call_elsewhere, now=now) is None
    assert preauth.candidate(Run.objects.get(pk=ticket.run_id), other_tool, now=now) is None
    # The control: the run's own call with the same tool finds it.
    found = preauth.candidate(Run.objects.get(pk=ticket.run_id), second_call(ticket, pre), now=now)
    assert found == pre


def test_candidate_reads_its_author_and_original_ticket_with_it(setup, django_assert_num_queries):
    _, ticket, approver = setup
    pre = edit_and_approve(ticket, user=approver, arguments=EDITED)
    run = Run.objects.get(pk=ticket.run_id)
    new = second_call(ticket, pre)
    now = timezone.now()

    # One query for the candidates (with author and original ticket), one for the membership.
    with django_assert_num_queries(2):
        found = preauth.candidate(run, new, now=now)
        names = (found.created_by.username, found.original_ticket.pk)

    assert names == ("approver", ticket.pk)


def test_candidate_of_an_author_who_left_or_was_deactivated_is_none(setup):
    tenant, ticket, approver = setup
    pre = edit_and_approve(ticket, user=approver, arguments=EDITED)
    run = Run.objects.get(pk=ticket.run_id)
    new = second_call(ticket, pre)
    now = timezone.now()

    approver.is_active = False
    approver.save(update_fields=["is_active"])
    assert preauth.candidate(run, new, now=now) is None

    approver.is_active = True
    approver.save(update_fields=["is_active"])
    # Still an approver, but of another tenant only.
    Membership.objects.filter(user=approver, tenant=tenant).delete()
    member(TenantFactory(), Role.APPROVER, username="approver")
    assert preauth.candidate(run, new, now=now) is None

    PreAuthorization.objects.filter(pk=pre.pk).update(created_by=None)
    assert preauth.candidate(run, new, now=now) is None


def test_candidate_passes_over_an_ineligible_author_to_the_next(setup):
    tenant, ticket, approver = setup
    first = edit_and_approve(ticket, user=approver, arguments=EDITED)
    # A second pre-authorisation of the same call, by another approver, made later.
    other = Ticket.objects.get(run=paused_run(tenant, requested_by=ticket.requested_by))
    second_approver = member(tenant, Role.APPROVER, username="second")
    later = edit_and_approve(other, user=second_approver, arguments=EDITED)
    PreAuthorization.objects.filter(pk=later.pk).update(run_id=ticket.run_id)
    Membership.objects.filter(user=approver, tenant=tenant).update(role=Role.VIEWER)

    found = preauth.candidate(
        Run.objects.get(pk=ticket.run_id), second_call(ticket, first), now=timezone.now()
    )

    assert (first.pk < later.pk, found) == (True, PreAuthorization.objects.get(pk=later.pk))


def test_candidate_passes_over_a_deactivated_author_to_the_next(setup):
    tenant, ticket, approver = setup
    first = edit_and_approve(ticket, user=approver, arguments=EDITED)
    other = Ticket.objects.get(run=paused_run(tenant, requested_by=ticket.requested_by))
    later = edit_and_approve(other, user=member(tenant, Role.APPROVER), arguments=EDITED)
    PreAuthorization.objects.filter(pk=later.pk).update(run_id=ticket.run_id)
    approver.is_active = False
    approver.save(update_fields=["is_active"])

    found = preauth.candidate(
        Run.objects.get(pk=ticket.run_id), second_call(ticket, first), now=timezone.now()
    )

    assert found == PreAuthorization.objects.get(pk=later.pk)
