"""A console that speaks docs/API.md from canned JSON, for the client's tests.

The scenario tests take the `console` fixture: a base URL, a token, a transport and a way to
have people decide. Here that is FakeConsole on an httpx.MockTransport, signing decisions with
an Ed25519 key made for the test; the same tests can run against a live console by a fixture
that yields an object with the same attributes (transport None, decide() through the API).
"""

from __future__ import annotations

import base64
import inspect
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from agents import Agent, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from approvals_client import ApprovalsClient, AsyncApprovalsClient
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from approvals.core.canonical import arguments_digest, canonical_json

TOKEN = "apc_abcd1234_" + "s" * 43
BASE_URL = "http://console.test"
TENANT = "acme"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def public_b64url(key: Ed25519PrivateKey) -> str:
    return b64url(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def sign(payload: dict, key: Ed25519PrivateKey, key_id: str) -> dict:
    """A SignedDecision exactly as the contract makes one."""
    message = canonical_json(payload).encode("utf-8")
    return {"payload": payload, "key_id": key_id, "signature": b64url(key.sign(message))}


def pending_calls(state: dict) -> list[dict]:
    """The tool approval items of a RunState JSON: one ticket each."""
    return [
        item["raw_item"]
        for item in state.get("generated_items") or []
        if item.get("type") == "tool_approval_item"
    ]


@dataclass
class FakeConsole:
    """The API's runs, keys and outcomes, served from memory. `requests` records every request."""

    base_url: str = BASE_URL
    token: str = TOKEN
    keys: dict[str, Ed25519PrivateKey] = field(default_factory=dict)
    runs: dict[int, dict] = field(default_factory=dict)
    requests: list[httpx.Request] = field(default_factory=list)
    outcomes: list[dict] = field(default_factory=list)
    # Answers to send before the real one: (status, headers, body).
    queued: list[tuple[int, dict, dict]] = field(default_factory=list)
    # GET /runs/{id} answers `paused` this many times before the decisions are in.
    polls_before_decided: int = 0
    pending_decisions: dict[int, dict[str, tuple[str, str]]] = field(default_factory=dict)
    next_id: int = 42

    def __post_init__(self) -> None:
        if not self.keys:
            self.keys["d1"] = Ed25519PrivateKey.generate()

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def paths(self, method: str = "GET") -> list[str]:
        return [r.url.path for r in self.requests if r.method == method]

    # --- people decide --------------------------------------------------------------------------

    def decide(self, run_id: int, decisions: dict[str, tuple[str, str]]) -> None:
        """Decide the run's tickets by call id: {"call_1": ("approve", "")}. The decisions are
        signed with the current key once the run has been polled polls_before_decided times."""
        self.pending_decisions[run_id] = decisions
        if self.polls_before_decided == 0:
            self._settle(run_id)

    def _settle(self, run_id: int) -> None:
        run = self.runs[run_id]
        key_id = next(iter(self.keys))
        signed = []
        for ticket in run["tickets"]:
            if ticket["call_id"] not in self.pending_decisions[run_id]:
                continue
            decision, message = self.pending_decisions[run_id][ticket["call_id"]]
            ticket["status"] = "approved" if decision == "approve" else "rejected"
            ticket["message"] = message
            payload = self.payload(run, ticket, decision=decision, message=message)
            signed.append(sign(payload, self.keys[key_id], key_id))
        run |= {"status": "awaiting_caller", "status_label": "Awaiting caller"}
        run["decisions"] = signed

    def payload(self, run: dict, ticket: dict, **changes: Any) -> dict:
        payload = {
            "v": 1,
            "tenant": run["tenant"],
            "run": run["id"],
            "generation": run["generation"],
            "ticket": ticket["id"],
            "call_id": ticket["call_id"],
            "tool_name": ticket["tool_name"],
            "arguments_digest": ticket["arguments_digest"],
            "decision": "approve",
            "message": "",
            "approvers": ["alice"],
            "decided_at": "2026-12-01T10:00:00Z",
        }
        return payload | changes

    # --- the API --------------------------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.queued:
            status, headers, body = self.queued.pop(0)
            return httpx.Response(status, headers=headers, json=body)
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return self.error(401, "This API token is not known.", "unknown_token")
        path = request.url.path.removeprefix("/api/v1")
        body = json.loads(request.content) if request.content else None
        if (request.method, path) == ("GET", "/keys"):
            return httpx.Response(200, json={"keys": self.published_keys()})
        if (request.method, path) == ("POST", "/runs"):
            return httpx.Response(
                202, json=self.new_run(body, status="starting", executor="console")
            )
        if (request.method, path) == ("POST", "/runs/paused"):
            run = self.new_run(body, status="paused", executor="caller")
            run["tickets"] = self.tickets(run, body["state"])
            return httpx.Response(201, json=run)
        parts = path.strip("/").split("/")
        if parts[0] == "runs" and len(parts) >= 2 and int(parts[1]) in self.runs:
            run = self.runs[int(parts[1])]
            if request.method == "GET" and len(parts) == 2:
                if run["id"] in self.pending_decisions and run["status"] == "paused":
                    self.polls_before_decided -= 1
                    if self.polls_before_decided <= 0:
                        self._settle(run["id"])
                return httpx.Response(200, json=run)
            if request.method == "POST" and parts[2:] == ["outcome"]:
                return self.outcome(run, body)
        return self.error(404, "No such run.", "not_found")

    def published_keys(self) -> list[dict]:
        return [
            {
                "id": key_id,
                "algorithm": "Ed25519",
                "public_key": public_b64url(key),
                "current": index == 0,
            }
            for index, (key_id, key) in enumerate(self.keys.items())
        ]

    def new_run(self, body: dict, *, status: str, executor: str) -> dict:
        run_id, self.next_id = self.next_id, self.next_id + 1
        self.runs[run_id] = {
            "id": run_id,
            "url": f"{self.base_url}/runs/{run_id}/",
            "status": status,
            "status_label": status.title(),
            "status_reason": "",
            "executor": executor,
            "tenant": TENANT,
            "agent": body["agent"],
            "version": body["version"],
            "title": body.get("title", ""),
            "generation": 1,
            "requested_by": None,
            "created_at": "2026-12-01T10:00:00Z",
            "updated_at": "2026-12-01T10:00:00Z",
            "finished_at": None,
            "final_output": "",
            "truncated": False,
            "tickets": [],
            "decisions": [],
        }
        return self.runs[run_id]

    def tickets(self, run: dict, state: dict) -> list[dict]:
        return [
            {
                "id": 100 * run["id"] + index,
                "url": f"{self.base_url}/tickets/{100 * run['id'] + index}/",
                "run": run["id"],
                "generation": run["generation"],
                "tool_name": call["name"],
                "call_id": call["call_id"],
                "arguments": json.loads(call["arguments"] or "{}"),
                "arguments_digest": arguments_digest(call["arguments"]),
                "status": "pending",
                "created_at": "2026-12-01T10:00:00Z",
                "expires_at": "2026-12-02T10:00:00Z",
                "decided_at": None,
                "decided_by": None,
                "message": "",
                "approvals": {"have": 0, "need": 1},
            }
            for index, call in enumerate(pending_calls(state))
        ]

    def outcome(self, run: dict, body: dict) -> httpx.Response:
        if run["status"] != "awaiting_caller":
            return self.error(409, f"Run {run['id']} is not awaiting its caller.", "conflict")
        self.outcomes.append(body)
        if body["status"] == "paused":
            run["generation"] += 1
            run |= {"status": "paused", "decisions": []}
            run["tickets"] = self.tickets(run, body["state"])
        else:
            run["status"] = body["status"]
            run["final_output"] = body.get("output", "")
            run["status_reason"] = body.get("error", "")
        return httpx.Response(200, json=run)

    @staticmethod
    def error(status: int, detail: str, code: str) -> httpx.Response:
        return httpx.Response(status, json={"detail": detail, "code": code})


@pytest.fixture
def console() -> FakeConsole:
    return FakeConsole()


class Both:
    """Either client behind one awaitable face, so each scenario runs sync and async alike."""

    def __init__(self, client: ApprovalsClient | AsyncApprovalsClient) -> None:
        self.client = client

    def __getattr__(self, name: str):
        method = getattr(self.client, name)

        async def call(*args, **kwargs):
            value = method(*args, **kwargs)
            return await value if inspect.isawaitable(value) else value

        return call


@pytest.fixture(params=["sync", "async"])
def client(request, console) -> Both:
    """The client of each kind, talking to the console fixture."""
    kind = ApprovalsClient if request.param == "sync" else AsyncApprovalsClient
    return Both(kind(console.base_url, console.token, transport=console.transport))


# --- the caller's own agent ---------------------------------------------------------------------


@dataclass
class CallerAgent:
    """An agent of the caller's service: its deploy tool counts each real execution."""

    agent: Agent
    model: ScriptedModel
    executions: list[dict] = field(default_factory=list)


def caller_agent(*turns: list[tuple[str, str | dict]], then: str = "done") -> CallerAgent:
    """A model that makes each turn's (call_id, arguments) deploy calls, then says `then`."""
    executions: list[dict] = []

    @function_tool(needs_approval=True)
    def deploy_release(release: str, environment: str) -> str:
        """Deploy a release to an environment."""
        executions.append({"release": release, "environment": environment})
        return f"Release {release} is live on {environment}."

    script = [[function_call("deploy_release", a, call_id=c) for c, a in turn] for turn in turns]
    model = ScriptedModel([*script, [assistant_message(then)]])
    agent = Agent(name="release", model=model, tools=[deploy_release])
    return CallerAgent(agent, model, executions)


STAGING = {"release": "2026.07.25", "environment": "staging"}
PRODUCTION = {"release": "2026.07.25", "environment": "production"}
