"""What a notification email says, read on its rendered text: which run and call, who asked,
who decided and why, how the run ended and what to do about it, and a link."""

from __future__ import annotations

import pytest
from django.db import transaction

from approvals.audit import chain
from approvals.decisions.decide import decide
from approvals.models import AuditEvent, Role, Run, RunStatus, Ticket
from approvals.runs.resume import resume
from notifications.emails import email_for
from notifications.events import event_for, facts_for
from tests.support import member, paused_run

pytestmark = pytest.mark.django_db

LINK = "https://approvals.example.com"


@pytest.fixture(autouse=True)
def _public_url(settings):
    settings.APPROVALS_PUBLIC_URL = LINK


@pytest.fixture
def people(tenant):
    return {
        "requester": member(tenant, Role.VIEWER, "req"),
        "approver": member(tenant, Role.APPROVER, "ann"),
    }


def _email(audit_event: AuditEvent) -> tuple[str, list[str]]:
    """The subject and the body's lines (blank ones left out) of the event's email."""
    subject, body = email_for(facts_for(audit_event, event_for(audit_event)))
    return subject, [line for line in body.splitlines() if line.strip()]


def _when(audit_event: AuditEvent) -> str:
    return f"When:    {audit_event.created_at:%Y-%m-%d %H:%M:%S} UTC"


def test_email_text_new_ticket_names_the_call_who_requested_it_and_the_link(tenant, people):
    run = paused_run(tenant, requested_by=people["requester"])
    ticket = Ticket.objects.get(run=run)
    event = AuditEvent.objects.get(action="ticket.created", ticket=ticket)

    subject, lines = _email(event)

    assert subject == "[Acme Corp] Approval needed: deploy_release"
    assert lines[:8] == [
        "Acme Corp: a tool call waits for your decision.",
        f"Run:     {run.title} (run {run.pk})",
        "Tool:    deploy_release",
        "Status:  pending",
        "Requested by: req",
        _when(event),
        f"Digest:  {ticket.arguments_digest}",
        f"Open it: {LINK}/tickets/{ticket.pk}/",
    ]


def test_email_text_rejected_ticket_names_who_rejected_why_and_who_requested(tenant, people):
    run = paused_run(tenant, requested_by=people["requester"])
    ticket = Ticket.objects.get(run=run)
    decide(ticket, user=people["approver"], approve=False, message="not during the freeze")
    event = AuditEvent.objects.get(action="ticket.rejected", ticket=ticket)

    subject, lines = _email(event)

    assert subject == "[Acme Corp] deploy_release rejected by ann"
    assert lines[:9] == [
        "Acme Corp: a tool call was rejected.",
        f"Run:     {run.title} (run {run.pk})",
        "Tool:    deploy_release",
        "Status:  rejected",
        "By:      ann",
        "Requested by: req",
        "Message: not during the freeze",
        _when(event),
        f"Digest:  {ticket.arguments_digest}",
    ]


# The resume runs the agent's tools in another thread, so the data must be committed.
@pytest.mark.django_db(transaction=True)
def test_email_text_run_completed_after_a_rejection_tells_it_with_the_output(tenant, people):
    run = paused_run(tenant, requested_by=people["requester"])
    ticket = Ticket.objects.get(run=run)
    decide(ticket, user=people["approver"], approve=False, message="not during the freeze")
    assert resume(run_id=run.pk, worker_id="w1").status == RunStatus.COMPLETED
    event = AuditEvent.objects.get(action="run.completed", run=run)

    subject, lines = _email(event)

    assert subject == f"[Acme Corp] Run completed: {run.title}"
    assert lines == [
        "Acme Corp: an agent run completed; 1 of its calls was not approved as asked.",
        f"Run:     {run.title} (run {run.pk})",
        "Status:  completed",
        f"By:      {event.actor_name}",
        _when(event),
        f"Open it: {LINK}/runs/{run.pk}/",
        "Decisions:",
        f"- deploy_release (ticket {ticket.pk}): rejected by ann",
        "  Message: not during the freeze",
        "Final output:",
        "Release 2026.07.24: not during the freeze",
        "The arguments are not in this email; the link shows them to members of Acme Corp.",
    ]


@pytest.mark.parametrize(
    ("action", "status", "lead", "what_to_do"),
    [
        ("run.failed", RunStatus.FAILED, "an agent run failed.", []),
        (
            "run.in_doubt",
            RunStatus.NEEDS_ATTENTION,
            "an agent run stopped and needs a person: an effect of a tool may or may not have "
            "happened.",
            [
                "What to do: an admin opens the run (the link above), checks whether the effect "
                "happened, and",
                'chooses "it happened", "retry" or "stop".',
            ],
        ),
        (
            "run.expired",
            RunStatus.EXPIRED,
            "an agent run expired before its calls were decided.",
            [],
        ),
    ],
)
def test_email_text_run_that_did_not_complete_says_why_and_what_to_do(
    tenant, people, action, status, lead, what_to_do
):
    run = paused_run(tenant, requested_by=people["requester"])
    ticket = Ticket.objects.get(run=run)
    decide(ticket, user=people["approver"], approve=True)
    Run.objects.filter(pk=run.pk).update(status=status, status_reason="the deploy API said 503")
    with transaction.atomic():
        event = chain.append(
            tenant_id=tenant.pk,
            action=action,
            actor_name="worker w1",
            run_id=run.pk,
            outcome=status,
        )

    _, lines = _email(event)

    assert lines == [
        f"Acme Corp: {lead}",
        f"Run:     {run.title} (run {run.pk})",
        f"Status:  {status}",
        "By:      worker w1",
        _when(event),
        f"Open it: {LINK}/runs/{run.pk}/",
        "Why it stopped: the deploy API said 503",
        *what_to_do,
        "Decisions:",
        f"- deploy_release (ticket {ticket.pk}): approved by ann",
        "The arguments are not in this email; the link shows them to members of Acme Corp.",
    ]
