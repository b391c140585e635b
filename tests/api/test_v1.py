from __future__ import annotations

import hashlib
import json

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from api import tokens, waiting
from api.models import ApiToken
from approvals import transitions
from approvals.core.signatures import decision_public_keys
from approvals.models import AuditEvent, Role, Run, RunStatus, Ticket, TicketStatus, TicketVote
from approvals.policies.versions import save_policy
from approvals.runs import remote
from tests.support import (
    TenantFactory,
    api_token,
    bearer,
    calling_agent,
    member,
    paused_run,
    run_agent,
    two_call_agent,
)

API = "/api/v1"
PRODUCTION = {"release": "2026.07.24", "environment": "production"}


@pytest.fixture
def world(db, settings):
    settings.APPROVALS_PUBLIC_URL = "https://console.example.com"
    tenant = TenantFactory(slug="acme")
    people = {
        "admin": member(tenant, Role.ADMIN, username="ada"),
        "requester": member(tenant, Role.APPROVER, username="rita"),
        "approver": member(tenant, Role.APPROVER, username="alice"),
        "approver2": member(tenant, Role.APPROVER, username="bob"),
        "viewer": member(tenant, Role.VIEWER, username="vic"),
    }
    run = paused_run(tenant, requested_by=people["requester"])
    return tenant, people, run


def paused_body() -> dict:
    """What a caller's process sends to hand over its pause of the release agent."""
    result = run_agent("release", "Deploy", agent=calling_agent(PRODUCTION))
    return {"agent": "release", "version": "1", "state": result.to_state().to_json()}


def call(method: str, path: str, secret: str | None = None, body=None, **query):
    client = Client()
    headers = bearer(secret) if secret else {}
    if method == "GET":
        return client.get(API + path, query, headers=headers)
    return client.post(
        API + path, json.dumps(body or {}), content_type="application/json", headers=headers
    )


# --- authentication, scopes, tenants ------------------------------------------------------------


OPERATIONS = [
    ("GET", "/runs", "runs:read"),
    ("GET", "/runs/{run}", "runs:read"),
    ("POST", "/runs", "runs:write"),
    ("POST", "/runs/paused", "runs:write"),
    ("POST", "/runs/{run}/outcome", "runs:write"),
    ("GET", "/tickets", "tickets:read"),
    ("GET", "/tickets/{ticket}", "tickets:read"),
    ("POST", "/tickets/{ticket}/decision", "tickets:decide"),
]


@pytest.mark.parametrize(("method", "path", "scope"), OPERATIONS)
def test_each_operation_refuses_a_token_without_its_scope(world, method, path, scope):
    tenant, people, run = world
    others = [s for s in tokens.SCOPES if s != scope]
    _, secret = api_token(tenant, *others, user=people["approver"])
    ticket = run.tickets.get()

    response = call(method, path.format(run=run.pk, ticket=ticket.pk), secret)

    assert response.status_code == 403
    assert response.json() == {
        "detail": f"This API token lacks the scope {scope}.",
        "code": "scope_missing",
    }
    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.PENDING


def test_unauthenticated_requests_are_told_why(world):
    tenant, people, run = world
    row, secret = api_token(tenant, "runs:read")

    assert call("GET", "/runs").json() == {
        "detail": "Send an API token in the header Authorization: Bearer apc_<prefix>_<secret>.",
        "code": "token_missing",
    }
    response = call("GET", "/runs", "apc_" + "x" * 8 + "_" + "y" * 43)
    assert (response.status_code, response.json()["code"]) == (401, "token_unknown")

    ApiToken.objects.filter(pk=row.pk).update(expires_at=row.created_at.replace(year=2025))
    response = call("GET", "/runs", secret)
    assert response.status_code == 401
    assert response.json()["code"] == "token_expired"
    assert response.json()["detail"].startswith("This API token expired on 2025-")


def test_a_revoked_token_is_refused_saying_when_and_by_whom(world):
    tenant, people, run = world
    row, secret = api_token(tenant, "runs:read")
    assert call("GET", f"/runs/{run.pk}", secret).status_code == 200

    tokens.revoke(row, by=people["admin"])
    response = call("GET", f"/runs/{run.pk}", secret)

    assert response.status_code == 401
    row.refresh_from_db()
    assert response.json() == {
        "detail": f"This API token was revoked on {row.revoked_at:%Y-%m-%d %H:%M} UTC by ada.",
        "code": "token_revoked",
    }


def test_another_tenants_ids_answer_exactly_like_missing_ones(world):
    tenant, people, run = world
    ticket = run.tickets.get()
    globex = TenantFactory(slug="globex")
    other_person = member(globex, Role.APPROVER, username="gary")
    _, mine = api_token(tenant, user=people["approver"])
    _, theirs = api_token(globex, user=other_person)
    missing = Run.objects.order_by("-pk").first().pk + 1000

    assert call("GET", f"/runs/{run.pk}", mine).status_code == 200
    outcome = {"status": "failed", "error": "x"}
    decision = {"decision": "reject", "arguments_digest": ticket.arguments_digest}
    for method, path, known, unknown, body, what in [
        ("GET", "/runs/{}", run.pk, missing, None, "run"),
        ("POST", "/runs/{}/outcome", run.pk, missing, outcome, "run"),
        ("GET", "/tickets/{}", ticket.pk, ticket.pk + 1000, None, "ticket"),
        ("POST", "/tickets/{}/decision", ticket.pk, ticket.pk + 1000, decision, "ticket"),
    ]:
        foreign = call(method, path.format(known), theirs, body=body)
        absent = call(method, path.format(unknown), theirs, body=body)
        assert foreign.status_code == absent.status_code == 404
        assert (
            foreign.json() == absent.json() == {"detail": f"No such {what}.", "code": "not_found"}
        )
    assert call("GET", "/runs", theirs).json()["items"] == []
    assert call("GET", "/tickets", theirs).json()["items"] == []
    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.PENDING


@pytest.fixture
def frozen_clock(monkeypatch):
    """Every clock read in the request sees 10:00:20 of today: one minute window."""
    moment = timezone.now().replace(hour=10, minute=0, second=20, microsecond=0)
    monkeypatch.setattr(timezone, "now", lambda: moment)
    return moment


def test_the_rate_limit_answers_429_with_retry_after(world, settings, frozen_clock):
    settings.APPROVALS_API_RATE_PER_MINUTE = 2
    tenant, people, run = world
    _, secret = api_token(tenant, "runs:read")
    _, other = api_token(tenant, "runs:read")

    statuses = [call("GET", "/runs", secret).status_code for _ in range(3)]

    assert statuses == [200, 200, 429]
    limited = call("GET", "/runs", secret)
    assert limited.status_code == 429
    assert limited["Retry-After"] == "40"
    assert limited.json() == {
        "detail": "Too many requests: try again in 40 seconds.",
        "code": "rate_limited",
    }
    # The limit is the token's: another token of the tenant is not held back.
    assert call("GET", "/runs", other).status_code == 200


def test_reads_write_last_use_once_a_minute(world, frozen_clock, django_assert_num_queries):
    tenant, people, run = world
    row, secret = api_token(tenant, "runs:read", "tickets:read")

    for path in ("/runs", f"/runs/{run.pk}", "/tickets"):
        assert call("GET", path, secret).status_code == 200

    row.refresh_from_db()
    assert row.last_used_at == frozen_clock
    [used] = AuditEvent.objects.filter(action="token.used")
    assert used.detail["prefix"] == row.prefix
    assert used.detail["path"] == "/api/v1/runs"
    # A later read in the window writes nothing: it reads the token and the runs, nothing else.
    with django_assert_num_queries(2):
        assert call("GET", "/runs", secret, limit=1).status_code == 200


def test_a_submit_costs_its_pause_and_one_query_of_its_own(world, frozen_clock):
    tenant, people, run = world
    person = people["requester"]
    _, secret = api_token(tenant, "runs:write", user=person)
    # The token's first request of the minute writes its use; the next ones write nothing.
    assert call("POST", "/runs/paused", secret, paused_body()).status_code == 201
    with CaptureQueriesContext(connection) as pause:
        remote.submit_paused(
            tenant=tenant,
            agent_key="release",
            agent_version="1",
            state_json=paused_body()["state"],
            requested_by=person,
        )

    with CaptureQueriesContext(connection) as request:
        answer = call("POST", "/runs/paused", secret, paused_body())

    assert answer.status_code == 201
    assert (answer.json()["status"], answer.json()["requested_by"]) == ("paused", "rita")
    # The token with its tenant, person and membership (one query): nothing else beside what
    # storing the pause itself reads and writes. The answer's tickets are those it opened.
    assert request[0]["sql"].split(" FROM ")[-1].split()[0] == '"api_apitoken"'
    assert len(request) == len(pause) + 1, [q["sql"][:120] for q in request]


def _state(agent) -> dict:
    return run_agent("release", "Deploy", agent=agent).to_state().to_json()


@pytest.mark.parametrize(
    "case",
    ["two calls", "a malformed call", "a call a rule approves", "a call a rule rejects"],
)
def test_a_submits_answer_is_what_reading_the_run_answers(world, case):
    tenant, people, _ = world
    _, secret = api_token(tenant, "runs:write", "runs:read", user=people["requester"])
    agent = calling_agent(PRODUCTION)
    if case == "two calls":
        agent = two_call_agent()
    elif case == "a malformed call":
        agent = calling_agent({"release": "2026.07.24"})
    else:
        verdict = "approve" if case == "a call a rule approves" else "reject"
        rule = {
            "argument": "environment",
            "op": "eq",
            "value": "production",
            "decision": verdict,
            "reason": "the rule of this test",
        }
        save_policy(
            tenant=tenant,
            user=people["admin"],
            agent_key="",
            tool_name="deploy_release",
            auto_rules=[rule],
        )
    body = {"agent": "release", "version": "1", "state": _state(agent)}

    answer = call("POST", "/runs/paused", secret, body)

    assert answer.status_code == 201, answer.json()
    submitted = answer.json()
    read = call("GET", f"/runs/{submitted['id']}", secret).json()
    # Shaped from the tickets as the submit opened them, never read back: the same answer.
    assert submitted == read
    statuses = [t["status"] for t in submitted["tickets"]]
    assert (
        statuses
        == {
            "two calls": ["pending", "pending"],
            "a malformed call": ["rejected"],
            "a call a rule approves": ["approved"],
            "a call a rule rejects": ["rejected"],
        }[case]
    )


# --- reading --------------------------------------------------------------------------------------


def test_a_run_reads_with_its_tickets_and_absolute_links(world):
    tenant, people, run = world
    ticket = run.tickets.get()
    _, secret = api_token(tenant, "runs:read")

    body = call("GET", f"/runs/{run.pk}", secret).json()

    assert body["id"] == run.pk
    assert body["url"] == f"https://console.example.com/runs/{run.pk}/"
    assert (body["status"], body["status_label"], body["executor"]) == (
        "paused",
        "Paused",
        "console",
    )
    assert (body["agent"], body["version"], body["requested_by"]) == ("release", "1", "rita")
    assert body["decisions"] == []
    assert body["truncated"] is False
    [shown] = body["tickets"]
    assert shown["id"] == ticket.pk
    assert shown["url"] == f"https://console.example.com/tickets/{ticket.pk}/"
    assert shown["arguments"] == json.loads(ticket.arguments_json)
    assert shown["arguments_digest"] == hashlib.sha256(ticket.arguments_json.encode()).hexdigest()
    assert shown["status"] == "pending"
    assert shown["approvals"] == {"have": 0, "need": 1}


def test_a_long_output_is_cut_and_said_so(world):
    tenant, people, run = world
    Run.objects.filter(pk=run.pk).update(final_output="x" * (64 * 1024 + 10))
    _, secret = api_token(tenant, "runs:read")

    body = call("GET", f"/runs/{run.pk}", secret).json()

    assert len(body["final_output"]) == 64 * 1024
    assert body["truncated"] is True


def test_runs_and_tickets_come_in_keyset_pages(world):
    tenant, people, first = world
    second = paused_run(tenant)
    third = paused_run(tenant)
    _, secret = api_token(tenant, "runs:read", "tickets:read")

    page = call("GET", "/runs", secret, limit=2).json()
    assert [r["id"] for r in page["items"]] == [third.pk, second.pk]
    assert "tickets" not in page["items"][0]
    rest = call("GET", "/runs", secret, limit=2, cursor=page["next_cursor"]).json()
    assert [r["id"] for r in rest["items"]] == [first.pk]
    assert rest["next_cursor"] is None

    assert call("GET", "/runs", secret, status="completed").json()["items"] == []
    tickets = call("GET", "/tickets", secret, run=second.pk, status="pending").json()
    assert [t["run"] for t in tickets["items"]] == [second.pk]

    broken = call("GET", "/runs", secret, cursor="not-a-cursor")
    assert broken.status_code == 400
    assert broken.json()["code"] == "bad_cursor"


def test_bad_query_values_answer_422_field_by_field(world):
    tenant, people, run = world
    _, secret = api_token(tenant, "runs:read")

    response = call("GET", "/runs", secret, limit=500, status="lost")

    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "invalid_request"
    assert {tuple(e["loc"]) for e in body["errors"]} == {("query", "limit"), ("query", "status")}
    assert body["detail"].startswith("The request is not valid: query.")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/runs/-3"),
        ("GET", "/tickets/abc"),
        ("POST", "/runs/-7869/outcome"),
        ("POST", "/tickets/0x1/decision"),
        ("GET", "/run"),
    ],
)
def test_a_path_that_names_no_operation_answers_the_apis_404(world, method, path):
    tenant, people, run = world
    _, secret = api_token(tenant, user=people["approver"])
    # The browser's client: a POST without a CSRF token must not meet the HTML 403 page.
    client = Client(enforce_csrf_checks=True)

    if method == "GET":
        response = client.get(API + path, headers=bearer(secret))
    else:
        response = client.post(
            API + path, "{}", content_type="application/json", headers=bearer(secret)
        )

    assert (response.status_code, response["Content-Type"]) == (
        404,
        "application/json; charset=utf-8",
    )
    assert response.json() == {
        "detail": "No such API operation; the operations are listed at /api/v1/docs.",
        "code": "not_found",
    }


def test_wait_holds_the_answer_until_the_run_moves_on(world, monkeypatch):
    tenant, people, run = world
    _, secret = api_token(tenant, "runs:read")
    pauses = []

    def pause(seconds):
        # The worker finishes the run while the request waits.
        pauses.append(seconds)
        if len(pauses) == 2:
            transitions.move_runs(Run.objects.filter(pk=run.pk), to=RunStatus.QUEUED)
            transitions.move_runs(Run.objects.filter(pk=run.pk), to=RunStatus.RESUMING)
            transitions.move_runs(Run.objects.filter(pk=run.pk), to=RunStatus.COMPLETED)

    monkeypatch.setattr(waiting, "sleep", pause)

    body = call("GET", f"/runs/{run.pk}", secret, wait=30).json()

    assert body["status"] == "completed"
    assert len(pauses) == 2


def test_wait_gives_up_after_the_seconds_asked(world, monkeypatch, settings):
    settings.APPROVALS_API_WAIT_POLL_SECONDS = 0.5
    tenant, people, run = world
    now = [0.0]
    pauses = []

    def pause(seconds):
        pauses.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(waiting, "sleep", pause)
    monkeypatch.setattr(waiting, "clock", lambda: now[0])

    status = waiting.wait_for_run(run.pk, seconds=2)

    assert status == "paused"
    assert pauses == [0.5, 0.5, 0.5, 0.5]


# --- deciding -------------------------------------------------------------------------------------


def decision(secret, ticket, verdict="approve", **extra):
    body = {"decision": verdict, "arguments_digest": ticket.arguments_digest, **extra}
    return call("POST", f"/tickets/{ticket.pk}/decision", secret, body=body)


def test_an_approval_is_the_tokens_person_and_audited_with_the_prefix(world):
    tenant, people, run = world
    ticket = run.tickets.get()
    row, secret = api_token(tenant, "tickets:decide", user=people["approver"])

    response = decision(secret, ticket)

    assert response.status_code == 200
    assert (response.json()["status"], response.json()["decided_by"]) == ("approved", "alice")
    ticket.refresh_from_db()
    assert (ticket.status, ticket.decided_by) == (TicketStatus.APPROVED, people["approver"])
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    event = AuditEvent.objects.get(action="ticket.approved")
    assert event.actor_id == people["approver"].pk
    assert (event.detail["via"], event.detail["prefix"]) == ("api", row.prefix)


def test_a_rejection_carries_its_message(world):
    tenant, people, run = world
    ticket = run.tickets.get()
    row, secret = api_token(tenant, "tickets:decide", user=people["approver"])

    response = decision(secret, ticket, "reject", message="Not on a Friday.")

    assert response.json()["status"] == "rejected"
    assert response.json()["message"] == "Not on a Friday."
    event = AuditEvent.objects.get(action="ticket.rejected")
    assert event.detail == {
        "always": False,
        "message": "Not on a Friday.",
        "via": "api",
        "prefix": row.prefix,
    }


def test_self_approval_is_refused_as_on_the_page(world):
    tenant, people, run = world
    ticket = run.tickets.get()
    _, secret = api_token(tenant, "tickets:decide", user=people["requester"])
    page = Client()
    page.force_login(people["requester"])
    on_page = page.post(f"/tickets/{ticket.pk}/decide/", {"decision": "approve"})

    response = decision(secret, ticket)

    assert response.status_code == on_page.status_code == 403
    assert response.json() == {
        "detail": "You requested this call, so someone else must approve it.",
        "code": "self_approval",
    }
    assert response.json()["detail"] in on_page.content.decode()
    ticket.refresh_from_db()
    assert ticket.status == TicketStatus.PENDING
    assert not AuditEvent.objects.filter(action__in=["ticket.approved", "ticket.vote"]).exists()


def test_a_person_who_lost_the_deciding_role_is_refused(world):
    tenant, people, run = world
    ticket = run.tickets.get()
    _, secret = api_token(tenant, "tickets:decide", user=people["approver"])
    people["approver"].memberships.update(role=Role.VIEWER)

    response = decision(secret, ticket)

    assert response.status_code == 403
    assert response.json() == {
        "detail": "The viewer role cannot decide tickets.",
        "code": "not_allowed",
    }
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING


def test_a_quorum_needs_two_people_over_the_api_too(world):
    tenant, people, run = world
    save_policy(
        tenant=tenant,
        user=people["admin"],
        tool_name="deploy_release",
        required_approvals=2,
    )
    ticket = run.tickets.get()
    first, first_secret = api_token(tenant, "tickets:decide", user=people["approver"])
    second, second_secret = api_token(tenant, "tickets:decide", user=people["approver2"])

    one = decision(first_secret, ticket)
    again = decision(first_secret, ticket)
    two = decision(second_secret, ticket)

    assert one.status_code == 200
    assert (one.json()["status"], one.json()["approvals"]) == ("pending", {"have": 1, "need": 2})
    assert again.status_code == 409
    assert again.json()["code"] == "already_voted"
    assert (two.json()["status"], two.json()["approvals"]) == ("approved", {"have": 2, "need": 2})
    assert TicketVote.objects.filter(ticket=ticket).count() == 2
    vote = AuditEvent.objects.get(action="ticket.vote")
    assert (vote.detail["via"], vote.detail["prefix"]) == ("api", first.prefix)
    approved = AuditEvent.objects.get(action="ticket.approved")
    assert (approved.actor_id, approved.detail["prefix"]) == (people["approver2"].pk, second.prefix)
    assert approved.detail["voters"] == ["alice", "bob"]


def test_the_digest_gate_refuses_a_decision_on_another_call(world):
    tenant, people, run = world
    ticket = run.tickets.get()
    _, secret = api_token(tenant, "tickets:decide", user=people["approver"])

    response = decision(secret, ticket, arguments_digest="0" * 64)

    assert response.status_code == 409
    assert response.json()["code"] == "digest_mismatch"
    assert response.json()["detail"] == (
        f"Not decided: this ticket's arguments digest is {ticket.arguments_digest}, not "
        f"{'0' * 64}; read the ticket again."
    )
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING


def test_a_decided_ticket_says_who_decided_it(world):
    tenant, people, run = world
    ticket = run.tickets.get()
    _, alice = api_token(tenant, "tickets:decide", user=people["approver"])
    _, bob = api_token(tenant, "tickets:decide", user=people["approver2"])
    decision(alice, ticket, "reject")

    response = decision(bob, ticket)

    assert response.status_code == 409
    assert response.json()["code"] == "already_decided"
    assert response.json()["detail"].startswith("Already rejected by alice at ")


def test_a_decision_body_that_does_not_fit_answers_422(world):
    tenant, people, run = world
    ticket = run.tickets.get()
    _, secret = api_token(tenant, "tickets:decide", user=people["approver"])

    response = call("POST", f"/tickets/{ticket.pk}/decision", secret, body={"decision": "maybe"})
    not_json = Client().post(
        f"{API}/tickets/{ticket.pk}/decision",
        "{not json",
        content_type="application/json",
        headers=bearer(secret),
    )

    assert response.status_code == 422
    assert {tuple(e["loc"]) for e in response.json()["errors"]} == {
        ("body", "body", "decision"),
        ("body", "body", "arguments_digest"),
    }
    assert not_json.status_code in (400, 422)
    assert set(not_json.json()) >= {"detail", "code"}
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING


# --- keys ----------------------------------------------------------------------------------------


def test_keys_publish_the_decision_keys_without_a_token(db):
    response = Client().get(f"{API}/keys")

    assert response.status_code == 200
    keys = response.json()["keys"]
    assert keys == decision_public_keys()
    assert [k["current"] for k in keys].count(True) == 1
    assert {k["algorithm"] for k in keys} == {"Ed25519"}


def test_an_approval_that_needs_a_second_factor_is_refused_with_the_reason(world):
    tenant, people, run = world
    save_policy(
        tenant=tenant,
        user=people["admin"],
        tool_name="deploy_release",
        step_up_minutes=10,
    )
    ticket = run.tickets.get()
    _, secret = api_token(tenant, "tickets:decide", user=people["approver"])

    response = decision(secret, ticket)

    assert response.status_code == 403
    assert response.json() == {
        "detail": "This approval needs a second factor confirmed within the last 10 minutes, "
        "which a batch or an API token cannot give: approve it from its ticket page.",
        "code": "step_up_required",
    }
    assert Ticket.objects.get(pk=ticket.pk).status == TicketStatus.PENDING
    assert TicketVote.objects.filter(ticket=ticket).count() == 0
    assert not AuditEvent.objects.filter(
        action__in=["ticket.approved", "ticket.vote", "auth.step_up"]
    ).exists()
    assert decision(secret, ticket, "reject").json()["status"] == "rejected"
