"""POST /api/v1/runs: the console runs the agent. 202 with the starting run and its Location; the
agent runs in the worker, never in the request; refusals are the start_run's sentences."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django_tasks_db.models import DBTaskResult
from release_agent import agent as release_agent

from approvals.models import AuditEvent, Role, Run, RunStatus
from tests.support import TenantFactory, api_token, bearer, member

API = "/api/v1"
START = {"agent": "release-pkg", "version": "1", "input": "Deploy 2026.07.25 to production"}


@pytest.fixture
def acme(db, settings):
    settings.APPROVALS_PUBLIC_URL = "https://console.example.com"
    tenant = TenantFactory(slug="acme")
    member(tenant, Role.VIEWER, username="rita")
    return tenant


def post(secret: str, body) -> object:
    return Client().post(
        f"{API}/runs", json.dumps(body), content_type="application/json", headers=bearer(secret)
    )


def test_post_runs_answers_202_with_the_starting_run_and_its_location(acme, monkeypatch):
    monkeypatch.setitem(release_agent.MODEL_CALLS, "count", 0)
    token, secret = api_token(acme, "runs:write", user=acme.memberships.get().user)

    response = post(secret, {**START, "session_id": "pipeline-7", "context": {"change": "C-1"}})

    run = Run.objects.get()
    assert response.status_code == 202
    assert response["Location"] == f"https://console.example.com/api/v1/runs/{run.pk}"
    body = response.json()
    assert (body["id"], body["status"], body["executor"]) == (run.pk, "starting", "console")
    assert (body["agent"], body["version"], body["requested_by"]) == ("release-pkg", "1", "rita")
    assert body["url"] == f"https://console.example.com/runs/{run.pk}/"
    assert (body["tickets"], body["final_output"]) == ([], "")
    assert run.status == RunStatus.STARTING
    # Never in the request: the model was not asked, the worker has its task.
    assert release_agent.MODEL_CALLS["count"] == 0
    assert DBTaskResult.objects.get().task_path == "approvals.execution.queue.start_run_task"
    started = AuditEvent.objects.get(run_id=run.pk, action="run.started")
    assert (started.actor_name, started.detail["via"], started.detail["prefix"]) == (
        "rita",
        "api",
        token.prefix,
    )


def test_post_runs_takes_a_list_of_input_items(acme):
    _, secret = api_token(acme, "runs:write")

    response = post(
        secret, {**START, "input": [{"role": "user", "content": "Deploy 2026.07.25 to staging"}]}
    )

    assert response.status_code == 202
    assert response.json()["title"] == "Deploy 2026.07.25 to staging"


@pytest.mark.parametrize(
    ("change", "status", "code", "detail"),
    [
        (
            {"agent": "payroll"},
            400,
            "unknown_agent",
            "Agent 'payroll' is not registered (neither in APPROVALS_AGENTS nor by an "
            "approvals.agents entry point).",
        ),
        (
            {"version": "3"},
            400,
            "unknown_agent",
            "Agent 'release-pkg' version '3' is not deployed (deployed: 1).",
        ),
        (
            {"context": {"token": "ghp_abcdefghijklmnopqrstuvwxyz0123456789"}},
            400,
            "secret_in_context",
            "The run's context holds what looks like a secret, which must never be stored: "
            "context.token (key name). Leave it out with a context_serializer and re-inject it "
            "in the context_deserializer from the environment.",
        ),
        (
            {"input": "  "},
            400,
            "start",
            "The input is empty: send a prompt or a list of input items.",
        ),
    ],
)
def test_post_runs_refuses_with_the_sentence_and_writes_nothing(acme, change, status, code, detail):
    _, secret = api_token(acme, "runs:write")

    response = post(secret, {**START, **change})

    assert response.status_code == status
    assert response.json() == {"detail": detail, "code": code}
    assert Run.objects.count() == 0
    assert DBTaskResult.objects.count() == 0


def test_post_runs_of_an_agent_registered_twice_is_a_409(acme, settings):
    settings.APPROVALS_AGENTS = {
        **settings.APPROVALS_AGENTS,
        "release-pkg": {"1": "devtools.demo.build_release_agent"},
    }
    _, secret = api_token(acme, "runs:write")

    response = post(secret, START)

    assert response.status_code == 409
    assert response.json()["code"] == "agent_conflict"
    assert response.json()["detail"].startswith("Agent 'release-pkg' is registered twice")
    assert Run.objects.count() == 0


def test_post_runs_body_that_does_not_fit_answers_422(acme):
    _, secret = api_token(acme, "runs:write")

    response = post(secret, {"agent": "release-pkg", "input": 5})

    assert response.status_code == 422
    locs = [e["loc"] for e in response.json()["errors"]]
    assert ["body", "body", "version"] in locs
    assert {loc[2] for loc in locs} == {"version", "input"}
    assert Run.objects.count() == 0


def test_the_schema_documents_what_post_runs_answers(db):
    schema = Client().get(f"{API}/openapi.json").json()

    statuses = set(schema["paths"]["/api/v1/runs"]["post"]["responses"])

    assert statuses == {"202", "400", "401", "403", "409", "422", "429", "503"}
