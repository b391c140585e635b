"""The client's requests and answers (docs/API.md, Operations), sync and async alike."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from agents import Runner
from approvals_client import ApiError, ApprovalsClient, WaitTimeout

from tests.clients.conftest import STAGING, TENANT, FakeConsole, caller_agent

RELEASE = {"agent": "release", "version": "1"}


def run(coroutine):
    return asyncio.run(coroutine)


def sent(console: FakeConsole, index: int = -1) -> dict:
    return json.loads(console.requests[index].content)


def test_import_needs_no_django():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    code = (
        "import sys, approvals_client; "
        "print(sorted(m for m in ('django', 'approvals') if m in sys.modules))"
    )
    # From / so that the console's packages are not on the path by accident.
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd="/", capture_output=True, text=True
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_start_run_sends_the_documented_body_with_the_token(client, console):
    started = run(
        client.start_run(
            "release", "1", "Deploy 2026.07.25", context={"ticket": "OPS-1"}, title="Deploy"
        )
    )
    request = console.requests[-1]
    assert (request.method, request.url.path) == ("POST", "/api/v1/runs")
    assert request.headers["authorization"] == f"Bearer {console.token}"
    assert sent(console) == {
        "agent": "release",
        "version": "1",
        "input": "Deploy 2026.07.25",
        "context": {"ticket": "OPS-1"},
        "title": "Deploy",
    }
    assert (started.id, started.status, started.executor, started.tenant) == (
        42,
        "starting",
        "console",
        TENANT,
    )


def test_submit_pause_sends_the_state_and_reads_its_tickets(client, console):
    async def scenario():
        caller = caller_agent([("call_1", STAGING)])
        result = await Runner.run(caller.agent, "Deploy")
        held = await client.submit_pause(result, agent="release", version="1", session_id="s-1")
        return result, held

    result, held = run(scenario())
    body = sent(console)
    assert console.requests[-1].url.path == "/api/v1/runs/paused"
    assert (body["agent"], body["version"], body["session_id"]) == ("release", "1", "s-1")
    assert body["state"] == result.to_state().to_json()
    assert (held.executor, held.status, held.generation) == ("caller", "paused", 1)
    [ticket] = held.tickets
    assert (ticket.call_id, ticket.tool_name, ticket.arguments) == (
        "call_1",
        "deploy_release",
        STAGING,
    )
    assert (ticket.status, ticket.approvals.need) == ("pending", 1)


def test_submit_pause_refuses_a_result_that_did_not_pause(client, console):
    async def scenario():
        caller = caller_agent()
        result = await Runner.run(caller.agent, "Say done")
        await client.submit_pause(result, agent="release", version="1")

    with pytest.raises(ValueError, match="no interruptions"):
        run(scenario())
    assert console.requests == []


def test_error_answer_is_an_api_error_with_detail_and_code(console):
    client = ApprovalsClient(console.base_url, "apc_wrong", transport=console.transport)
    with pytest.raises(ApiError) as raised:
        client.get_run(42)
    assert (raised.value.status, raised.value.detail, raised.value.code) == (
        401,
        "This API token is not known.",
        "unknown_token",
    )


def test_error_answer_that_is_not_json_still_gets_a_reason(client, console):
    console.queued.append((502, {}, None))
    with pytest.raises(ApiError) as raised:
        run(client.get_run(42))
    assert (raised.value.status, raised.value.code) == (502, "")
    assert raised.value.detail


def test_answer_that_does_not_fit_the_contract_is_an_api_error(client, console):
    console.queued.append((200, {}, {"id": "forty-two"}))
    with pytest.raises(ApiError, match="run.id is str, not int") as raised:
        run(client.get_run(42))
    assert raised.value.code == "bad_answer"


def test_429_is_sent_again_once_after_retry_after(client, console):
    console.new_run(RELEASE, status="paused", executor="caller")
    console.queued.append((429, {"Retry-After": "0"}, {"detail": "Too many", "code": "throttled"}))
    assert run(client.get_run(42)).id == 42
    assert console.paths() == ["/api/v1/runs/42", "/api/v1/runs/42"]


def test_429_twice_is_an_api_error_after_one_retry(client, console):
    for _ in range(2):
        console.queued.append((429, {"Retry-After": "0"}, {"detail": "Too many.", "code": "rate"}))
    with pytest.raises(ApiError) as raised:
        run(client.get_run(42))
    assert (raised.value.status, len(console.requests)) == (429, 2)


@pytest.mark.parametrize(
    ("options", "retry_after"),
    [({"retries_on_429": 0}, "0"), ({"longest_retry_wait": 5}, "6"), ({}, "soon")],
    ids=["no-retries", "too-long", "unreadable"],
)
def test_429_is_not_retried_when_it_may_not_be(console, options, retry_after):
    console.queued.append((429, {"Retry-After": retry_after}, {"detail": "Too many.", "code": "r"}))
    client = ApprovalsClient(
        console.base_url, console.token, transport=console.transport, **options
    )
    with pytest.raises(ApiError):
        client.get_run(42)
    assert len(console.requests) == 1


def test_wait_for_decisions_long_polls_until_the_run_is_decided(client, console):
    async def scenario():
        caller = caller_agent([("call_1", STAGING)])
        held = await client.submit_pause(
            await Runner.run(caller.agent, "Deploy"), agent="release", version="1"
        )
        console.polls_before_decided = 3
        console.decide(held.id, {"call_1": ("approve", "")})
        return await client.wait_for_decisions(held.id)

    decided = run(scenario())
    assert decided.status == "awaiting_caller"
    polls = [r for r in console.requests if r.method == "GET"]
    assert [r.url.params.get("wait") for r in polls] == ["30", "30", "30"]


def test_wait_for_decisions_gives_up_at_its_timeout_with_the_last_run(client, console):
    console.new_run(RELEASE, status="paused", executor="caller")
    with pytest.raises(WaitTimeout) as raised:
        run(client.wait_for_decisions(42, timeout=0))
    assert (raised.value.run.id, raised.value.run.status) == (42, "paused")
    assert len(console.requests) == 1


def test_public_keys_are_fetched_once(client, console):
    first = run(client.public_keys())
    second = run(client.public_keys())
    assert first == second
    assert (first["d1"].algorithm, len(first["d1"].public_key), first["d1"].current) == (
        "Ed25519",
        32,
        True,
    )
    assert console.paths() == ["/api/v1/keys"]


def _awaiting(console: FakeConsole) -> int:
    return console.new_run(RELEASE, status="awaiting_caller", executor="caller")["id"]


@pytest.mark.parametrize(
    ("outcome", "body"),
    [
        ({"completed": "All live."}, {"status": "completed", "output": "All live."}),
        ({"completed": {"live": True}}, {"status": "completed", "output": '{"live": true}'}),
        ({"completed": None}, {"status": "completed", "output": ""}),
        (
            {"failed": "Deploy host unreachable."},
            {"status": "failed", "error": "Deploy host unreachable."},
        ),
    ],
)
def test_report_outcome_sends_the_documented_body(client, console, outcome, body):
    run_id = _awaiting(console)
    reported = run(client.report_outcome(run_id, **outcome))
    assert sent(console) == body
    assert console.requests[-1].url.path == f"/api/v1/runs/{run_id}/outcome"
    assert reported.status == body["status"]


def test_report_outcome_needs_exactly_one_outcome(client, console):
    with pytest.raises(ValueError, match="exactly one"):
        run(client.report_outcome(42, completed="x", failed="y"))
    with pytest.raises(ValueError, match="exactly one"):
        run(client.report_outcome(42))
    assert console.requests == []


def test_report_a_result_that_paused_again_sends_its_new_state(client, console):
    async def scenario():
        caller = caller_agent([("call_1", STAGING)])
        result = await Runner.run(caller.agent, "Deploy")
        run_id = _awaiting(console)
        return result, await client.report(run_id, result)

    result, reported = run(scenario())
    assert sent(console) == {"status": "paused", "state": result.to_state().to_json()}
    assert (reported.status, reported.generation, len(reported.tickets)) == ("paused", 2, 1)


def test_conflict_is_the_consoles_sentence(client, console):
    console.new_run(RELEASE, status="paused", executor="caller")
    with pytest.raises(ApiError) as raised:
        run(client.report_outcome(42, completed="done"))
    assert (raised.value.status, raised.value.detail) == (409, "Run 42 is not awaiting its caller.")
