"""AsyncApprovalsClient: the API over httpx.AsyncClient, driving the same flows of protocol.py
as ApprovalsClient (client.py) with asyncio I/O."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import httpx

from approvals_client import protocol
from approvals_client.models import AppliedDecisions, Page, PublicKey, Run, SignedDecision, Ticket

T = TypeVar("T")


class AsyncApprovalsClient:
    """The async twin of ApprovalsClient: the same methods, awaited.

    A client of one console, authenticated by one API token (`apc_...`).

    timeout: seconds for each request (a long poll adds the time the console may hold it).
    retries_on_429: how many times a 429 is sent again after its Retry-After (0: never), as long
    as that is at most longest_retry_wait seconds. transport: an httpx transport (tests).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries_on_429: int = 1,
        longest_retry_wait: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.timeout = timeout
        self._protocol = protocol.Protocol(
            retries_on_429=retries_on_429, longest_retry_wait=longest_retry_wait
        )
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=protocol.headers(token),
            timeout=timeout,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncApprovalsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _drive(self, flow: protocol.Flow[T]) -> T:
        reply: httpx.Response | None = None
        while True:
            try:
                step = flow.send(reply)
            except StopIteration as done:
                return done.value
            if isinstance(step, protocol.Sleep):
                await asyncio.sleep(step.seconds)
                reply = None
            else:
                reply = await self._http.send(step.build(self._http, self.timeout))

    async def _send(self, call: protocol.Call[T]) -> T:
        return await self._drive(self._protocol.exchange(call))

    # --- runs -----------------------------------------------------------------------------------

    async def start_run(
        self,
        agent: str,
        version: str,
        input: str | list[Any],
        *,
        session_id: str | None = None,
        context: Mapping[str, Any] | None = None,
        title: str | None = None,
    ) -> Run:
        """Start a registered agent in the console's worker: the Run, in `starting`."""
        return await self._send(
            protocol.start_run(
                agent, version, input, session_id=session_id, context=context, title=title
            )
        )

    async def submit_pause(
        self,
        result_or_state: Any,
        *,
        agent: str,
        version: str,
        session_id: str | None = None,
        title: str | None = None,
    ) -> Run:
        """Hand over a paused run (a RunResult with interruptions, a RunState or its JSON):
        the Run (executor caller) with one ticket per interruption. Keep it: apply_decisions
        checks the decisions against it."""
        return await self._send(
            protocol.submit_pause(
                result_or_state, agent=agent, version=version, session_id=session_id, title=title
            )
        )

    async def get_run(self, run_id: int, *, wait: float = 0) -> Run:
        """The Run; with wait (at most 30 s) the console holds the answer while it is decided."""
        return await self._send(protocol.get_run(run_id, wait=wait))

    async def list_runs(self, **filters: Any) -> Page:
        """One page of runs, newest first: status=, agent=, cursor=, limit=."""
        return await self._send(protocol.list_runs(**filters))

    # The same signature as the sync client's; the timeout's WaitTimeout carries the last Run.
    async def wait_for_decisions(
        self,
        run_id: int,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Run:
        """Long-poll until the run is no longer starting, paused, queued or resuming, and return
        it. Raises WaitTimeout (with the last Run) after timeout seconds; None waits on."""
        return await self._drive(self._protocol.wait_for_decisions(run_id, timeout=timeout))

    async def report_outcome(
        self,
        run_id: int,
        *,
        completed: Any = protocol.UNSET,
        paused: Any = None,
        failed: str | None = None,
    ) -> Run:
        """Report what the resumed run did: exactly one of completed=<final output>,
        paused=<new RunResult or RunState> (a new generation of tickets) or failed=<error>."""
        return await self._send(
            protocol.report_outcome(run_id, completed=completed, paused=paused, failed=failed)
        )

    async def report(self, run: Run | int, result: Any) -> Run:
        """report_outcome from a RunResult: paused when it has interruptions, else completed."""
        return await self._send(protocol.report(run, result))

    # --- decisions ------------------------------------------------------------------------------

    async def public_keys(self, *, refresh: bool = False) -> dict[str, PublicKey]:
        """The console's published decision keys by id, fetched once and cached."""
        return await self._drive(self._protocol.public_keys(refresh=refresh))

    async def apply_decisions(
        self, state: Any, run: Run, decisions: Iterable[SignedDecision] | None = None
    ) -> AppliedDecisions:
        """Verify every signed decision (of `run`, or `decisions`) against the run you hold and
        your own RunState, then approve or reject each interruption on that state. Raises
        DecisionRefused, having applied nothing, when any check fails."""
        return await self._drive(self._protocol.apply_decisions(state, run, decisions))

    # --- tickets --------------------------------------------------------------------------------

    async def get_ticket(self, ticket_id: int) -> Ticket:
        return await self._send(protocol.get_ticket(ticket_id))

    async def list_tickets(self, **filters: Any) -> Page:
        """One page of tickets: status=, run=, cursor=, limit=."""
        return await self._send(protocol.list_tickets(**filters))

    async def decide(
        self, ticket_id: int, decision: str, *, arguments_digest: str, message: str | None = None
    ) -> Ticket:
        """Approve or reject a ticket as the token's person; the digest must be the ticket's."""
        return await self._send(
            protocol.decide(ticket_id, decision, arguments_digest=arguments_digest, message=message)
        )
