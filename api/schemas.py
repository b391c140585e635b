"""The API's JSON: the schemas of what it reads and answers, and the one place a Run and a
Ticket are shaped (docs/API.md). Links are absolute, from APPROVALS_PUBLIC_URL."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from django.conf import settings
from django.db.models import Prefetch, QuerySet
from django.urls import reverse
from ninja import Field, Schema

from approvals.models import Run, RunStatus, Ticket, TicketStatus, TicketVote
from approvals.policies import quorum, scopes

# A run's final output is cut to this many characters in the API ("truncated": true).
OUTPUT_CAP = 64 * 1024
MAX_ID = 2**63 - 1
MAX_PAGE = 100

RunStatusName = Literal[tuple(RunStatus.values)]  # type: ignore[valid-type]
TicketStatusName = Literal[tuple(TicketStatus.values)]  # type: ignore[valid-type]


# --- answers ---------------------------------------------------------------------------------


class ErrorOut(Schema):
    detail: str = Field(description="What is wrong, in one sentence.")
    code: str = Field(description="The refusal, in snake_case (e.g. self_approval).")


class FieldErrorOut(Schema):
    loc: list[str] = Field(description="Where: body, query or path, then the field.")
    msg: str


class ValidationErrorOut(ErrorOut):
    errors: list[FieldErrorOut]


class ApprovalsOut(Schema):
    have: int = Field(description="Valid approvals given so far.")
    need: int = Field(description="Approvals the ticket's policy asks for.")


class TicketOut(Schema):
    id: int
    url: str
    run: int
    generation: int
    tool_name: str
    call_id: str
    arguments: Any = Field(description="The call's canonical arguments, parsed.")
    arguments_digest: str = Field(description="SHA-256 hex of the canonical arguments.")
    status: TicketStatusName
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    message: str = Field(description="The rejection message the model reads.")
    approvals: ApprovalsOut


class RunSummaryOut(Schema):
    id: int
    tenant: str = Field(description="The tenant's slug; a signed decision names it too.")
    url: str
    status: RunStatusName
    status_label: str
    status_reason: str
    executor: Literal["console", "caller"]
    agent: str
    version: str
    title: str
    generation: int
    requested_by: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    final_output: str = Field(description=f"Cut to {OUTPUT_CAP} characters.")
    truncated: bool


class RunOut(RunSummaryOut):
    tickets: list[TicketOut] = Field(description="The tickets of the current generation.")
    decisions: list[dict[str, Any]] = Field(
        description="Signed decisions, one per ticket, for a caller's run awaiting the caller."
    )


class RunPageOut(Schema):
    items: list[RunSummaryOut]
    next_cursor: str | None


class TicketPageOut(Schema):
    items: list[TicketOut]
    next_cursor: str | None


class KeyOut(Schema):
    id: str
    algorithm: Literal["Ed25519"]
    public_key: str = Field(description="base64url of the raw 32-byte public key, no padding.")
    current: bool


class KeysOut(Schema):
    keys: list[KeyOut]


# --- requests --------------------------------------------------------------------------------


class DecisionIn(Schema):
    decision: Literal["approve", "reject"]
    message: str = Field("", max_length=2000, description="Sent to the model on a rejection.")
    arguments_digest: str = Field(
        ..., max_length=64, description="The digest the ticket shows: the call you decide."
    )


class StartRunIn(Schema):
    agent: str = Field(..., min_length=1, max_length=100)
    version: str = Field(..., min_length=1, max_length=50)
    input: str | list[dict[str, Any]] = Field(
        ..., description="A prompt, or a list of input items."
    )
    session_id: str = Field("", max_length=255)
    context: dict[str, Any] | None = None
    title: str = Field("", max_length=200)


class PausedRunIn(Schema):
    agent: str = Field(..., min_length=1, max_length=100)
    version: str = Field(..., min_length=1, max_length=50)
    state: dict[str, Any] = Field(..., description="RunState.to_json() of the paused run.")
    session_id: str = Field("", max_length=255)
    title: str = Field("", max_length=200)


class OutcomeIn(Schema):
    status: Literal["completed", "paused", "failed"]
    output: str = ""
    state: dict[str, Any] | None = None
    error: str = Field("", max_length=10000)


# --- shaping ---------------------------------------------------------------------------------


def absolute(path: str) -> str:
    return settings.APPROVALS_PUBLIC_URL.rstrip("/") + path


def tickets_for_shaping(tickets: QuerySet[Ticket]) -> QuerySet[Ticket]:
    """What ticket_json reads, in a fixed number of queries for any number of tickets."""
    # The votes unordered: a ticket's JSON counts them and names none of their voters.
    return tickets.select_related("policy", "decided_by").prefetch_related(
        Prefetch("votes", queryset=TicketVote.objects.select_related("user").order_by())
    )


def ticket_json(ticket: Ticket, *, votes: list[TicketVote] | None = None) -> dict[str, Any]:
    """votes: the ticket's votes when the caller knows them without a query (a ticket just
    opened has none); else read, or taken from tickets_for_shaping's prefetch."""
    votes = list(ticket.votes.all()) if votes is None else votes
    progress = quorum.progress(ticket, scopes.policy_of(ticket), votes)
    return {
        "id": ticket.pk,
        "url": absolute(reverse("approvals:ticket", args=[ticket.pk])),
        "run": ticket.run_id,
        "generation": ticket.generation,
        "tool_name": ticket.tool_name,
        "call_id": ticket.tool_call_id,
        "arguments": json.loads(ticket.arguments_json),
        "arguments_digest": ticket.arguments_digest,
        "status": ticket.status,
        "created_at": ticket.created_at,
        "expires_at": ticket.expires_at,
        "decided_at": ticket.decided_at,
        "decided_by": ticket.decided_by.get_username() if ticket.decided_by_id else None,
        "message": ticket.decision_message,
        "approvals": {"have": progress.count, "need": progress.required},
    }


def runs_for_shaping(runs: QuerySet[Run]) -> QuerySet[Run]:
    # The sealed state is never shaped: it stays in the database.
    return runs.select_related("requested_by", "tenant").defer("state_ciphertext", "state_nonce")


def run_summary_json(run: Run) -> dict[str, Any]:
    output = run.final_output or ""
    return {
        "id": run.pk,
        "tenant": run.tenant.slug,
        "url": absolute(reverse("approvals:run", args=[run.pk])),
        "status": run.status,
        "status_label": run.get_status_display(),
        "status_reason": run.status_reason,
        "executor": run.executor,
        "agent": run.agent_key,
        "version": run.agent_version,
        "title": run.title,
        "generation": run.state_generation,
        "requested_by": run.requested_by.get_username() if run.requested_by_id else None,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "finished_at": run.finished_at,
        "final_output": output[:OUTPUT_CAP],
        "truncated": len(output) > OUTPUT_CAP,
    }


def run_json(
    run: Run, *, decisions: list[dict[str, Any]], opened: list[Ticket] | None = None
) -> dict[str, Any]:
    """The whole Run: its summary, the tickets of its current generation and, for a caller's
    run awaiting the caller, the signed decisions it resumes on.

    opened: the current generation's tickets as the caller just opened them, in order, with no
    votes yet (runs.remote.Submitted): shaped as they are, without reading them back.
    """
    if opened is not None:
        shaped = [ticket_json(t, votes=[]) for t in opened]
    else:
        tickets = tickets_for_shaping(
            Ticket.objects.filter(run=run, generation=run.state_generation).order_by("pk")
        )
        shaped = [ticket_json(t) for t in tickets]
    return {**run_summary_json(run), "tickets": shaped, "decisions": decisions}
