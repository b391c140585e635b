"""Version 1 of the HTTP API (docs/API.md): runs, tickets and the decision keys.

Each operation finds its object within the token's tenant (another tenant's id answers 404
like a missing one), calls the one approvals function that owns the rule, and shapes the
answer with api.schemas. Refusals become `{"detail", "code"}` in api.errors.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Path, Query
from ninja.responses import Status

from api import errors, tokens, waiting
from api.auth import TokenAuth
from api.errors import ApiError
from api.models import ApiToken, Scope
from api.schemas import (
    MAX_ID,
    MAX_PAGE,
    DecisionIn,
    ErrorOut,
    KeysOut,
    OutcomeIn,
    PausedRunIn,
    RunOut,
    RunPageOut,
    RunStatusName,
    StartRunIn,
    TicketOut,
    TicketPageOut,
    TicketStatusName,
    ValidationErrorOut,
    absolute,
    run_json,
    run_summary_json,
    runs_for_shaping,
    ticket_json,
    tickets_for_shaping,
)
from approvals.core.pagination import BadCursor, after_descending
from approvals.core.signatures import decision_public_keys
from approvals.decisions import decide
from approvals.models import Run, RunExecutor, RunStatus, Ticket
from approvals.runs import remote
from approvals.runs.start import start_run as start_agent_run

api = NinjaAPI(
    title="Approval console API",
    version="1",
    description="Runs, tickets and decisions of one tenant, as its API tokens allow. "
    "See docs/API.md.",
    urls_namespace="api-v1",
    # The docs page is the console's own (api.urls): it needs nothing from the internet.
    docs_url=None,
)
errors.install(api)

ID = Path(..., ge=1, le=MAX_ID)


# A Django view, not an operation: the CSRF check would answer a POST with the HTML 403 page.
@csrf_exempt
def unknown_path(request: HttpRequest, rest: str) -> HttpResponse:
    """Any path under /api/v1/ that names no operation (a misspelt path, an id that is not a
    positive number): the API's 404, in JSON like every refusal, never the console's page."""
    return api.create_response(
        request,
        {
            "detail": "No such API operation; the operations are listed at /api/v1/docs.",
            "code": "not_found",
        },
        status=404,
    )


def answers(ok: dict[int, Any], *refusals: int) -> dict[int, Any]:
    """The statuses an operation answers: its own, the refusals it names, and those of every
    operation behind a token (401, 403, 422, 429, 503)."""
    shapes: dict[int, Any] = dict(ok)
    for status in sorted({401, 403, 422, 429, 503, *refusals}):
        shapes[status] = ValidationErrorOut if status == 422 else ErrorOut
    return shapes


def _token(request: HttpRequest) -> ApiToken:
    return request.auth  # type: ignore[attr-defined,no-any-return]


def _run_of(token: ApiToken, run_id: int) -> Run:
    run = runs_for_shaping(Run.objects.filter(pk=run_id, tenant_id=token.tenant_id)).first()
    if run is None:
        raise errors.not_found("run")
    return run


def _ticket_of(token: ApiToken, ticket_id: int) -> Ticket:
    ticket = (
        tickets_for_shaping(Ticket.objects.filter(pk=ticket_id, tenant_id=token.tenant_id))
        .select_related("run")
        .first()
    )
    if ticket is None:
        raise errors.not_found("ticket")
    return ticket


def _page(queryset, cursor: str | None, limit: int):
    try:
        return after_descending(queryset, ("created_at", "id"), cursor, (datetime, int), limit)
    except BadCursor:
        raise ApiError(
            400,
            "bad_cursor",
            "That cursor is broken or out of date; start again from the first page.",
        ) from None


def _full_run(run: Run, *, opened: list[Ticket] | None = None) -> dict[str, Any]:
    decisions: list[dict[str, Any]] = []
    if run.executor == RunExecutor.CALLER and run.status == RunStatus.AWAITING_CALLER:
        decisions = remote.signed_decisions(run)
    return run_json(run, decisions=decisions, opened=opened)


# --- keys ------------------------------------------------------------------------------------


@api.get("/keys", response={200: KeysOut, 503: ErrorOut}, tags=["keys"])
def keys(request: HttpRequest):
    """The public keys that sign decisions (Ed25519). No token needed."""
    return {"keys": decision_public_keys()}


# --- runs ------------------------------------------------------------------------------------


@api.get(
    "/runs",
    auth=TokenAuth(Scope.RUNS_READ),
    response=answers({200: RunPageOut}, 400),
    tags=["runs"],
)
def list_runs(
    request: HttpRequest,
    status: RunStatusName | None = None,
    agent: str | None = Query(None, max_length=100),
    cursor: str | None = Query(None, max_length=500),
    limit: int = Query(50, ge=1, le=MAX_PAGE),
):
    """The tenant's runs, newest first, a page at a time (scope runs:read)."""
    runs = Run.objects.filter(tenant_id=_token(request).tenant_id)
    if status:
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent_key=agent)
    page = _page(runs_for_shaping(runs), cursor, limit)
    return {"items": [run_summary_json(r) for r in page.rows], "next_cursor": page.next_cursor}


@api.get(
    "/runs/{int:id}",
    auth=TokenAuth(Scope.RUNS_READ),
    response=answers({200: RunOut}, 404),
    tags=["runs"],
)
def get_run(
    request: HttpRequest,
    id: int = ID,
    wait: int = Query(0, ge=0, le=waiting.MAX_WAIT_SECONDS),
):
    """One run with its current tickets (scope runs:read). wait=N (0 to 30) holds the answer
    until the run is no longer starting, paused, queued or resuming, or N seconds pass."""
    token = _token(request)
    run = _run_of(token, id)
    if wait and run.status in waiting.MOVING:
        waiting.wait_for_run(run.pk, seconds=wait)
        run = _run_of(token, id)
    return _full_run(run)


@api.post(
    "/runs",
    auth=TokenAuth(Scope.RUNS_WRITE),
    response=answers({202: RunOut}, 400, 409),
    tags=["runs"],
)
def start_run(request: HttpRequest, response: HttpResponse, body: StartRunIn):
    """Start a registered agent in a worker, never in the request (scope runs:write): 202 with
    the run, starting, and its Location. An agent or version not deployed here answers 400, an
    agent key registered twice 409, a context that holds a secret or cannot be stored 400."""
    token = _token(request)
    run = start_agent_run(
        tenant=token.tenant,
        agent_key=body.agent,
        agent_version=body.version,
        input=body.input,
        requested_by=token.user,
        session_id=body.session_id,
        context=body.context,
        title=body.title,
        via=tokens.via(token),
    )
    response["Location"] = absolute(f"/api/v1/runs/{run.pk}")
    return Status(202, _full_run(_run_of(token, run.pk)))


@api.post(
    "/runs/paused",
    auth=TokenAuth(Scope.RUNS_WRITE),
    response=answers({201: RunOut}, 400, 404, 409),
    tags=["runs"],
)
def submit_paused(request: HttpRequest, response: HttpResponse, body: PausedRunIn):
    """Hand over a paused run the caller resumes itself (scope runs:write): 201 with the run
    and its tickets."""
    token = _token(request)
    submitted = remote.submit_paused(
        tenant=token.tenant,
        agent_key=body.agent,
        agent_version=body.version,
        state_json=body.state,
        requested_by=token.user,
        session_id=body.session_id,
        title=body.title,
        via=tokens.via(token),
    )
    response["Location"] = absolute(f"/api/v1/runs/{submitted.run.pk}")
    # The run as submit_paused read it back, with the token's tenant and person it was given,
    # and its tickets as it opened them: nothing is read again.
    return Status(201, _full_run(submitted.run, opened=submitted.tickets))


@api.post(
    "/runs/{int:id}/outcome",
    auth=TokenAuth(Scope.RUNS_WRITE),
    response=answers({200: RunOut}, 400, 404, 409),
    tags=["runs"],
)
def report_outcome(request: HttpRequest, body: OutcomeIn, id: int = ID):
    """A caller's run reports how it ended, or its next pause (scope runs:write)."""
    token = _token(request)
    run = _run_of(token, id)
    remote.report_outcome(
        run,
        status=body.status,
        output=body.output,
        state_json=body.state,
        error=body.error,
        actor=token.user,
        via=tokens.via(token),
    )
    return _full_run(_run_of(token, id))


# --- tickets ---------------------------------------------------------------------------------


@api.get(
    "/tickets",
    auth=TokenAuth(Scope.TICKETS_READ),
    response=answers({200: TicketPageOut}, 400),
    tags=["tickets"],
)
def list_tickets(
    request: HttpRequest,
    status: TicketStatusName | None = None,
    run: int | None = Query(None, ge=1, le=MAX_ID),
    cursor: str | None = Query(None, max_length=500),
    limit: int = Query(50, ge=1, le=MAX_PAGE),
):
    """The tenant's tickets, newest first, a page at a time (scope tickets:read)."""
    tickets = Ticket.objects.filter(tenant_id=_token(request).tenant_id)
    if status:
        tickets = tickets.filter(status=status)
    if run:
        tickets = tickets.filter(run_id=run)
    page = _page(tickets_for_shaping(tickets), cursor, limit)
    return {"items": [ticket_json(t) for t in page.rows], "next_cursor": page.next_cursor}


@api.get(
    "/tickets/{int:id}",
    auth=TokenAuth(Scope.TICKETS_READ),
    response=answers({200: TicketOut}, 404),
    tags=["tickets"],
)
def get_ticket(request: HttpRequest, id: int = ID):
    """One ticket (scope tickets:read)."""
    return ticket_json(_ticket_of(_token(request), id))


@api.post(
    "/tickets/{int:id}/decision",
    auth=TokenAuth(Scope.TICKETS_DECIDE),
    response=answers({200: TicketOut}, 400, 404, 409),
    tags=["tickets"],
)
def decide_ticket(request: HttpRequest, body: DecisionIn, id: int = ID):
    """Approve or reject a ticket as the token's person (scope tickets:decide), with every
    rule of the ticket page. arguments_digest must be the digest the ticket shows."""
    token = _token(request)
    ticket = _ticket_of(token, id)
    decide.decide(
        ticket,
        user=token.user,
        approve=body.decision == "approve",
        message=body.message,
        shown_digest=body.arguments_digest,
        via=tokens.via(token),
    )
    return ticket_json(_ticket_of(token, id))
