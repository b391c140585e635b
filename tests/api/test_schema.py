"""The API against its own OpenAPI schema: every operation, fed by schemathesis, answers only
statuses the schema documents, never a 5xx, and every answer fits the schema it documents.

The schema is the one served at /api/v1/openapi.json, loaded from the WSGI application in this
process, so the requests run inside the test's transaction and see its data: a tenant with a
console's paused run, a caller's paused run and one awaiting its caller, and another tenant's
run. The token has every scope and acts as an approver who did not request the runs, so a
decision can succeed. Generation is seeded and bounded: the same requests on every run.
"""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api import waiting
from approvals.decisions import decide
from approvals.models import Role
from tests.support import (
    TenantFactory,
    api_token,
    caller_run,
    calling_agent,
    member,
    paused_run,
    run_agent,
)

SCHEMA_PATH = "/api/v1/openapi.json"
SEED = 13
# Requests per operation, valid and invalid ones together.
EXAMPLES = 40


def no_undocumented_server_error(ctx, response, case) -> None:
    """No 5xx, except the 501 an operation documents for a capability this build lacks (POST
    /runs until the console starts runs itself). 503 (the database did not answer) is
    documented too, but the database always answers here: a 503 would hide a broken query."""
    status = response.status_code
    documented = status == 501 and "501" in case.operation.responses.status_codes
    if status >= 500 and not documented:
        raise AssertionError(f"{case.operation.label} answered {status}: {response.text[:300]}")


CHECKS = [
    no_undocumented_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
OPERATIONS = [
    ("GET", "/api/v1/keys"),
    ("GET", "/api/v1/runs"),
    ("POST", "/api/v1/runs"),
    ("GET", "/api/v1/runs/{id}"),
    ("POST", "/api/v1/runs/paused"),
    ("POST", "/api/v1/runs/{id}/outcome"),
    ("GET", "/api/v1/tickets"),
    ("GET", "/api/v1/tickets/{id}"),
    ("POST", "/api/v1/tickets/{id}/decision"),
]


@pytest.fixture
def in_test_transaction(db):
    """Requests through the WSGI handler keep the test's connection (and its transaction): the
    handler would close it at each request's start and end, as Django's test client avoids."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def fake_wait(monkeypatch):
    """?wait=N moves a fake clock on instead of sleeping: a long poll answers at once."""
    now = [0.0]

    def pause(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr(waiting, "clock", lambda: now[0])
    monkeypatch.setattr(waiting, "sleep", pause)


@pytest.fixture
def world(in_test_transaction, fake_wait, settings):
    # Hundreds of requests a minute from one token: the rate limit is not what is tested here.
    settings.APPROVALS_API_RATE_PER_MINUTE = 100_000
    tenant = TenantFactory(slug="acme")
    requester = member(tenant, Role.APPROVER, username="rita")
    approver = member(tenant, Role.APPROVER, username="alice")
    console = paused_run(tenant, requested_by=requester)
    caller = caller_run(tenant, requested_by=requester)
    awaiting = caller_run(tenant, requested_by=requester)
    decide.decide(awaiting.tickets.get(), user=approver, approve=True)
    awaiting.refresh_from_db()
    elsewhere = paused_run(TenantFactory(slug="globex"))
    _, secret = api_token(tenant, user=approver)
    state = run_agent(
        "release",
        "Deploy",
        agent=calling_agent({"release": "2026.07.24", "environment": "staging"}),
    ).to_state()
    tickets = [
        t for run in (console, caller, awaiting, elsewhere) for t in run.tickets.order_by("pk")
    ]
    return {
        "secret": secret,
        "runs": [run.pk for run in (console, caller, awaiting, elsewhere)],
        "awaiting": awaiting.pk,
        "tickets": {t.pk: t.arguments_digest for t in tickets},
        "state": state.to_json(),
    }


@pytest.fixture
def api_schema(world):
    config = schemathesis.Config.from_dict(
        {"headers": {"Authorization": f"Bearer {world['secret']}"}}
    )
    return schemathesis.openapi.from_wsgi(SCHEMA_PATH, get_wsgi_application(), config=config)


def known_requests(operation, world) -> list[st.SearchStrategy]:
    """Requests that name the world's objects, so the operation also answers its successes."""
    method, path = operation.method.upper(), operation.path
    positive = GenerationMode.POSITIVE
    if path == "/api/v1/runs/{id}":
        return [operation.as_strategy(positive, path_parameters={"id": r}) for r in world["runs"]]
    if path == "/api/v1/tickets/{id}":
        return [
            operation.as_strategy(positive, path_parameters={"id": t}) for t in world["tickets"]
        ]
    if path == "/api/v1/tickets/{id}/decision":
        return [
            operation.as_strategy(
                positive,
                path_parameters={"id": ticket},
                body={"decision": decision, "arguments_digest": digest, "message": "no"},
            )
            for ticket, digest in world["tickets"].items()
            for decision in ("approve", "reject")
        ]
    if path == "/api/v1/runs/{id}/outcome":
        bodies = [
            {"status": "completed", "output": "deployed"},
            {"status": "paused", "state": world["state"]},
            {"status": "failed", "error": "gave up"},
        ]
        return [
            operation.as_strategy(positive, path_parameters={"id": run}, body=body)
            for run in world["runs"]
            for body in bodies
        ]
    if (method, path) == ("POST", "/api/v1/runs/paused"):
        body = {"agent": "release", "version": "1", "state": world["state"], "title": "Deploy"}
        return [operation.as_strategy(positive, body=body)]
    if (method, path) == ("POST", "/api/v1/runs"):
        body = {"agent": "release", "version": "1", "input": "Deploy 2026.07.24 to staging"}
        return [operation.as_strategy(positive, body=body)]
    if path in ("/api/v1/runs", "/api/v1/tickets"):
        return [operation.as_strategy(positive, query={"limit": 1})]
    return []


def test_the_schema_lists_every_operation(api_schema):
    served = [
        (result.ok().method.upper(), result.ok().path) for result in api_schema.get_all_operations()
    ]

    assert sorted(served) == sorted(OPERATIONS)


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_each_operation_answers_as_its_schema_says(api_schema, world, method, path):
    operation = api_schema[path][method]
    # About a third each: valid requests, requests naming the world's objects, invalid ones.
    strategies = [operation.as_strategy(GenerationMode.POSITIVE)]
    known = known_requests(operation, world)
    if known:
        strategies.append(st.one_of(known))
    if operation.body or operation.path_parameters or operation.query:
        strategies.append(operation.as_strategy(GenerationMode.NEGATIVE))

    @hypothesis.seed(SEED)
    @hypothesis.settings(
        max_examples=EXAMPLES,
        database=None,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(case=st.one_of(strategies))
    def exchange(case):
        case.call_and_validate(checks=CHECKS)

    exchange()
