"""A ticket's decision record: votes, the decision, the exact arguments and digest, the policy
version, what ran and the run's outcome, for auditors and admins; its exports are audited."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.urls import reverse

from approvals.decisions.decide import decide
from approvals.decisions.record import CSV_HEADER, VIEWS_NOT_RECORDED
from approvals.models import AuditEvent, Role, Ticket
from approvals.policies.versions import save_policy
from approvals.runs.resume import resume
from tests.support import TenantFactory, member, paused_run, pending_ticket

pytestmark = pytest.mark.django_db


def record_url(ticket: Ticket) -> str:
    return reverse("approvals:ticket-record", args=[ticket.pk])


def export_url(ticket: Ticket, fmt: str) -> str:
    return reverse("approvals:ticket-record-export", args=[ticket.pk, fmt])


@pytest.fixture
def decided(db):
    """A ticket two approvers approved under a policy v1 of two approvals, and its run resumed
    and completed: the effect is in the ledger."""
    tenant = TenantFactory(slug="acme")
    admin = member(tenant, Role.ADMIN, username="root")
    save_policy(tenant=tenant, user=admin, tool_name="deploy_release", required_approvals=2)
    run = paused_run(tenant, requested_by=member(tenant, Role.VIEWER, username="req"))
    ticket = Ticket.objects.get(run=run)
    decide(ticket, user=member(tenant, Role.APPROVER, username="ann"), approve=True)
    decide(ticket, user=member(tenant, Role.APPROVER, username="ben"), approve=True)
    resume(run_id=run.pk, worker_id="w1")
    ticket.refresh_from_db()
    return tenant, ticket


@pytest.mark.django_db(transaction=True)
def test_record_shows_votes_decision_arguments_policy_and_what_ran(client, decided):
    tenant, ticket = decided
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(record_url(ticket))

    assert response.status_code == 200
    body = response.content.decode()
    record = response.context["record"]
    assert [v.user.username for v in record.votes] == ["ann", "ben"]
    assert (record.policy_label, record.required_approvals) == ("v1", 2)
    assert [(e.operation, e.status) for e in record.effects] == [("deploy_release", "done")]
    assert "Approved by ben at" in body
    assert f'<code class="hash" id="record-digest">sha256:{ticket.arguments_digest}</code>' in body
    assert (
        '<pre class="value wrap" id="record-json-arguments">'
        "{&quot;environment&quot;:&quot;production&quot;,&quot;release&quot;:&quot;2026.07.24&quot;}"
        "</pre>"
    ) in body
    assert "v1 · 2 approvals needed" in body
    assert "Result: Release 2026.07.24 is live on production." in body
    assert "Release 2026.07.24: Release 2026.07.24 is live on production." in body
    assert VIEWS_NOT_RECORDED in body
    actions = [e.action for e, _ in record.events]
    assert actions[:3] == ["run.paused", "ticket.created", "ticket.vote"]
    assert actions[-1] == "run.completed"
    assert "<strong>ben</strong> approved <strong>deploy_release</strong> on" in body


@pytest.mark.django_db(transaction=True)
def test_record_json_export_is_exact_and_audited(client, decided):
    tenant, ticket = decided
    auditor = member(tenant, Role.AUDITOR)
    client.force_login(auditor)

    response = client.get(export_url(ticket, "json"))

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == (
        f'attachment; filename="ticket-{ticket.pk}-record.json"'
    )
    data = json.loads(response.content)
    assert data["arguments_json"] == ticket.arguments_json
    assert data["arguments_digest"] == ticket.arguments_digest
    assert data["policy"] == {"version": 1, "label": "v1", "required_approvals": 2}
    assert [(v["user"], v["valid"]) for v in data["votes"]] == [("ann", True), ("ben", True)]
    assert data["decision"]["decided_by"] == "ben"
    assert data["decision"]["status"] == "approved"
    assert [(e["operation"], e["status"], e["result"]) for e in data["effects"]] == [
        ("deploy_release", "done", "Release 2026.07.24 is live on production.")
    ]
    assert data["run"]["status"] == "completed"
    assert data["views"] == {"recorded": False, "note": VIEWS_NOT_RECORDED}
    exported = AuditEvent.objects.get(action="audit.record_exported")
    assert (exported.ticket_id, exported.actor_id, exported.detail) == (
        ticket.pk,
        auditor.pk,
        {"format": "json"},
    )


@pytest.mark.django_db(transaction=True)
def test_record_csv_export_has_one_row_per_fact(client, decided):
    tenant, ticket = decided
    client.force_login(member(tenant, Role.ADMIN))

    response = client.get(export_url(ticket, "csv"))

    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == CSV_HEADER
    assert ["arguments", "digest", "", "", ticket.arguments_digest] in rows
    assert [r[3] for r in rows if r[0] == "vote"] == ["ann", "ben"]
    [decision] = [r for r in rows if r[0] == "decision"]
    assert decision[:2] == ["decision", "approved"] and decision[3] == "ben"
    assert [r[4] for r in rows if r[0] == "effect"] == [
        "done: Release 2026.07.24 is live on production."
    ]
    assert AuditEvent.objects.get(action="audit.record_exported").detail == {"format": "csv"}


def test_record_of_a_pending_ticket_says_it_is_not_decided(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant)
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(record_url(ticket))

    body = response.content.decode()
    assert "Pending (not decided yet; expires" in body
    assert "Nothing ran for this ticket through the ledger." in body


@pytest.mark.parametrize("role", [Role.VIEWER, Role.APPROVER])
def test_record_is_refused_to_roles_without_history(client, role):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant)
    client.force_login(member(tenant, role))

    page = client.get(record_url(ticket))
    exported = client.get(export_url(ticket, "json"))

    assert (page.status_code, exported.status_code) == (403, 403)
    assert "Only auditors and admins read a ticket&#x27;s decision record." in page.content.decode()
    assert not AuditEvent.objects.filter(action="audit.record_exported").exists()


@pytest.mark.parametrize("url", [record_url, lambda t: export_url(t, "csv")])
def test_record_of_another_tenant_is_404(client, url):
    ticket = pending_ticket(TenantFactory())
    client.force_login(member(TenantFactory(), Role.ADMIN))

    response = client.get(url(ticket))

    assert response.status_code == 404
    assert not AuditEvent.objects.filter(action="audit.record_exported").exists()


def test_record_export_in_another_format_is_404(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant)
    client.force_login(member(tenant, Role.AUDITOR))

    response = client.get(export_url(ticket, "xml"))

    assert response.status_code == 404


def test_record_post_is_refused(client):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant)
    client.force_login(member(tenant, Role.AUDITOR))

    assert client.post(record_url(ticket)).status_code == 405
    assert client.post(export_url(ticket, "json")).status_code == 405


@pytest.mark.parametrize(("role", "linked"), [(Role.AUDITOR, True), (Role.APPROVER, False)])
def test_record_is_linked_from_the_ticket_page_for_history_roles(client, role, linked):
    tenant = TenantFactory()
    ticket = pending_ticket(tenant)
    client.force_login(member(tenant, role))

    body = client.get(reverse("approvals:ticket", args=[ticket.pk])).content.decode()

    link = f'<a href="{record_url(ticket)}" id="record-link">Decision record</a>'
    assert (link in body) is linked
