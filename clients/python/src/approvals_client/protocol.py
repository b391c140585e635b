"""The API's requests and answers, without I/O: both clients send what these build and parse
what comes back with the same functions, so the sync and async clients cannot drift apart.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Generic, TypeVar

import httpx
from agents import RunState

from approvals_client import decisions
from approvals_client.errors import ApiError, WaitTimeout
from approvals_client.models import AppliedDecisions, Page, PublicKey, Run, SignedDecision, Ticket

T = TypeVar("T")

PREFIX = "/api/v1"
VERSION = "0.1.0"
# The longest hold the console allows on GET /runs/{id}?wait=N.
MAX_WAIT = 30


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Mapping[str, Any] = field(default_factory=dict)
    body: Any = None
    # Seconds the console may hold the answer (a long poll): the read timeout grows by as much.
    hold: float = 0

    def build(self, client: httpx.Client | httpx.AsyncClient, timeout: float) -> httpx.Request:
        params = {k: v for k, v in self.params.items() if v is not None}
        return client.build_request(
            self.method,
            PREFIX + self.path,
            params=params or None,
            json=self.body,
            timeout=timeout + self.hold,
        )


def headers(token: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json",
        "User-Agent": f"approvals-client/{VERSION}",
    }


# --- answers ------------------------------------------------------------------------------------


def error(response: httpx.Response) -> ApiError:
    """The console's {"detail", "code"} as an ApiError; a body that is not one still gets a reason."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, Mapping) and isinstance(body.get("detail"), str):
        errors = body.get("errors")
        return ApiError(
            response.status_code,
            body["detail"],
            str(body.get("code") or ""),
            errors=errors if isinstance(errors, list) else None,
        )
    text = response.text.strip()[:200] or response.reason_phrase
    return ApiError(response.status_code, text, "")


def _json(response: httpx.Response) -> Any:
    if response.is_error:
        raise error(response)
    try:
        return response.json()
    except ValueError:
        raise ApiError(response.status_code, "the answer is not JSON", "bad_answer") from None


def _reading(parse: Callable[[Any], T]) -> Callable[[httpx.Response], T]:
    def read(response: httpx.Response) -> T:
        data = _json(response)
        try:
            return parse(data)
        except ApiError as problem:
            raise ApiError(response.status_code, problem.detail, problem.code) from None

    return read


def _page(parse_item: Callable[[Any], Any]) -> Callable[[Any], Page]:
    def parse(data: Any) -> Page:
        if not isinstance(data, Mapping) or not isinstance(data.get("items"), list):
            raise ApiError(0, "the answer is not a page of items", "bad_answer")
        cursor = data.get("next_cursor")
        return Page(tuple(parse_item(i) for i in data["items"]), cursor or None)

    return parse


read_run = _reading(Run.from_json)
read_ticket = _reading(Ticket.from_json)
read_keys: Callable[[httpx.Response], dict[str, PublicKey]] = _reading(decisions.parse_keys)


def retry_delay(response: httpx.Response, *, attempt: int, retries: int, longest: float) -> float:
    """Seconds to wait before sending again, or -1 to give up: only a 429, only `retries` times,
    only as long as its Retry-After (seconds or an HTTP date) asks for no more than `longest`."""
    if response.status_code != 429 or attempt >= retries:
        return -1
    value = response.headers.get("Retry-After", "").strip()
    if value.isdigit():
        delay = float(value)
    else:
        try:
            delay = (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds()
        except (TypeError, ValueError):
            return -1
    return max(0.0, delay) if delay <= longest else -1


# --- what a caller hands over -------------------------------------------------------------------


def state_json(result_or_state: Any) -> dict[str, Any]:
    """The RunState JSON object of a paused RunResult, a RunState, its JSON text or its dict."""
    if isinstance(result_or_state, Mapping):
        return dict(result_or_state)
    if isinstance(result_or_state, str):
        value = json.loads(result_or_state)
        if not isinstance(value, dict):
            raise ValueError("the state's JSON text is not an object")
        return value
    if isinstance(result_or_state, RunState):
        return result_or_state.to_json()
    if hasattr(result_or_state, "to_state") and hasattr(result_or_state, "interruptions"):
        if not result_or_state.interruptions:
            raise ValueError("the run result has no interruptions: there is no pause to hand over")
        return result_or_state.to_state().to_json()
    raise TypeError(
        f"expected a paused RunResult, a RunState or its JSON, not {type(result_or_state).__name__}"
    )


# "Not given", where None is a value a caller may mean (a final output of None).
UNSET: Any = object()


def output_text(output: Any) -> str:
    """A final output as the text the console stores (None is empty)."""
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    dump = getattr(output, "model_dump", None)
    if callable(dump):
        output = dump(mode="json")
    return json.dumps(output, ensure_ascii=False, default=str)


def _optional(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


# --- the operations (docs/API.md, Operations) ---------------------------------------------------


def get_keys() -> Call[dict[str, PublicKey]]:
    return Call("GET", "/keys", read_keys)


def start_run(
    agent: str,
    version: str,
    input: str | list[Any],
    *,
    session_id: str | None = None,
    context: Mapping[str, Any] | None = None,
    title: str | None = None,
) -> Call[Run]:
    body = {"agent": agent, "version": version, "input": input}
    body |= _optional(session_id=session_id, context=context, title=title)
    return Call("POST", "/runs", read_run, body=body)


def submit_pause(
    result_or_state: Any,
    *,
    agent: str,
    version: str,
    session_id: str | None = None,
    title: str | None = None,
) -> Call[Run]:
    body = {"agent": agent, "version": version, "state": state_json(result_or_state)}
    body |= _optional(session_id=session_id, title=title)
    return Call("POST", "/runs/paused", read_run, body=body)


def get_run(run_id: int, *, wait: float = 0) -> Call[Run]:
    wait = max(0, min(MAX_WAIT, int(wait)))
    return Call("GET", f"/runs/{int(run_id)}", read_run, params={"wait": wait or None}, hold=wait)


def list_runs(
    *, status: str | None = None, agent: str | None = None, cursor: str | None = None, limit=None
) -> Call[Page]:
    params = {"status": status, "agent": agent, "cursor": cursor, "limit": limit}
    return Call("GET", "/runs", _reading(_page(Run.from_json)), params=params)


def report_outcome(
    run_id: int, *, completed: Any = UNSET, paused: Any = None, failed: str | None = None
) -> Call[Run]:
    given = (completed is not UNSET) + (paused is not None) + (failed is not None)
    if given != 1:
        raise ValueError("report exactly one of completed=, paused= or failed=")
    if completed is not UNSET:
        body = {"status": "completed", "output": output_text(completed)}
    elif paused is not None:
        body = {"status": "paused", "state": state_json(paused)}
    else:
        body = {"status": "failed", "error": str(failed)}
    return Call("POST", f"/runs/{int(run_id)}/outcome", read_run, body=body)


def report(run: Run | int, result: Any) -> Call[Run]:
    """The outcome a RunResult shows: paused again when it has interruptions, else completed."""
    run_id = run.id if isinstance(run, Run) else run
    if getattr(result, "interruptions", None):
        return report_outcome(run_id, paused=result)
    return report_outcome(run_id, completed=result.final_output)


def get_ticket(ticket_id: int) -> Call[Ticket]:
    return Call("GET", f"/tickets/{int(ticket_id)}", read_ticket)


def list_tickets(
    *, status: str | None = None, run: int | None = None, cursor: str | None = None, limit=None
) -> Call[Page]:
    params = {"status": status, "run": run, "cursor": cursor, "limit": limit}
    return Call("GET", "/tickets", _reading(_page(Ticket.from_json)), params=params)


def decide(
    ticket_id: int, decision: str, *, arguments_digest: str, message: str | None = None
) -> Call[Ticket]:
    if decision not in ("approve", "reject"):
        raise ValueError("decision is approve or reject")
    body = {"decision": decision, "arguments_digest": arguments_digest} | _optional(message=message)
    return Call("POST", f"/tickets/{int(ticket_id)}/decision", read_ticket, body=body)


# --- flows: the logic of each operation, as generators both clients drive -----------------------


@dataclass(frozen=True)
class Sleep:
    seconds: float


# A flow yields a Call (the driver sends back its httpx.Response) or a Sleep (the driver sends
# back None once the time has passed) and returns the operation's result.
Flow = Generator["Call[Any] | Sleep", "httpx.Response | None", T]


class Protocol:
    """What both clients share besides the requests: the 429 policy, the long-poll loop and the
    cache of published decision keys."""

    def __init__(self, *, retries_on_429: int, longest_retry_wait: float) -> None:
        self.retries_on_429 = retries_on_429
        self.longest_retry_wait = longest_retry_wait
        self.keys: dict[str, PublicKey] = {}

    def exchange(self, call: Call[T]) -> Flow[T]:
        attempt = 0
        while True:
            response = yield call
            assert response is not None
            delay = retry_delay(
                response,
                attempt=attempt,
                retries=self.retries_on_429,
                longest=self.longest_retry_wait,
            )
            if delay < 0:
                return call.parse(response)
            attempt += 1
            yield Sleep(delay)

    def wait_for_decisions(self, run_id: int, *, timeout: float | None) -> Flow[Run]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = MAX_WAIT if deadline is None else deadline - time.monotonic()
            run = yield from self.exchange(get_run(run_id, wait=max(0, min(MAX_WAIT, left))))
            if not run.is_waiting:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(run, timeout or 0)

    def public_keys(self, *, refresh: bool = False) -> Flow[dict[str, PublicKey]]:
        if refresh or not self.keys:
            self.keys = yield from self.exchange(get_keys())
        return dict(self.keys)

    def apply_decisions(
        self, state: Any, run: Run, signed: Iterable[SignedDecision] | None
    ) -> Flow[AppliedDecisions]:
        state = decisions.own_state(state)
        signed = list(run.decisions if signed is None else signed)
        keys = yield from self.public_keys()
        # A key id not seen yet may be a key the console added since: ask once more, no more.
        if decisions.unknown_key_ids(signed, keys):
            keys = yield from self.public_keys(refresh=True)
        planned = decisions.check(state, run, signed, keys)
        return decisions.apply(state, planned)
