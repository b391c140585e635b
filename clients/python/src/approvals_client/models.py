"""The objects of the API (docs/API.md, Objects), parsed from their JSON.

Fields the contract documents are typed; anything else the console sends is kept in `raw`.
A signed decision keeps its payload exactly as received (`signed_payload`): the signature covers
that JSON, never a re-serialisation of the dataclass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from approvals_client.errors import ApiError

T = TypeVar("T")

# Statuses in which people are still deciding (or the console is still working): a caller waits.
WAITING_STATUSES = frozenset({"starting", "paused", "queued", "resuming"})


class _Reader:
    """Typed access to one JSON object; a missing or mistyped field is an ApiError naming it."""

    def __init__(self, data: Any, what: str) -> None:
        if not isinstance(data, Mapping):
            raise _bad(f"{what} is not a JSON object")
        self.data = data
        self.what = what

    def get(self, key: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise _bad(f"{self.what} has no {key!r}")
        value = self.data[key]
        if value is None and optional:
            return None
        # bool is an int in Python; JSON keeps them apart.
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
            raise _bad(f"{self.what}.{key} is {type(value).__name__}, not {_names(kind)}")
        return value

    def str(self, key: str, *, default: str | None = None) -> str:
        value = self.get(key, str, optional=default is not None)
        return default if value is None else value

    def int(self, key: str) -> int:
        return self.get(key, int)

    def time(self, key: str) -> datetime | None:
        value = self.get(key, str, optional=True)
        if value is None:
            return None
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            raise _bad(f"{self.what}.{key} is not an ISO 8601 time: {value!r}") from None

    def list_of(self, key: str, parse: Callable[[Any], T]) -> tuple[T, ...]:
        values = self.get(key, list, optional=True) or []
        return tuple(parse(value) for value in values)


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in _kinds(kind))


def _bad(detail: str) -> ApiError:
    return ApiError(200, f"the console's answer does not fit the contract: {detail}", "bad_answer")


@dataclass(frozen=True)
class Approvals:
    have: int
    need: int


@dataclass(frozen=True)
class Ticket:
    id: int
    url: str
    run: int
    generation: int
    tool_name: str
    call_id: str
    arguments: Any
    arguments_digest: str
    status: str
    created_at: datetime | None
    expires_at: datetime | None
    decided_at: datetime | None
    decided_by: str | None
    message: str
    approvals: Approvals
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> Ticket:
        r = _Reader(data, "ticket")
        approvals = _Reader(r.get("approvals", dict, optional=True) or {}, "ticket.approvals")
        return cls(
            id=r.int("id"),
            url=r.str("url", default=""),
            run=r.int("run"),
            generation=r.int("generation"),
            tool_name=r.str("tool_name"),
            call_id=r.str("call_id"),
            arguments=data.get("arguments"),
            arguments_digest=r.str("arguments_digest"),
            status=r.str("status"),
            created_at=r.time("created_at"),
            expires_at=r.time("expires_at"),
            decided_at=r.time("decided_at"),
            decided_by=r.get("decided_by", str, optional=True),
            message=r.str("message", default=""),
            approvals=Approvals(
                have=approvals.get("have", int, optional=True) or 0,
                need=approvals.get("need", int, optional=True) or 0,
            ),
            raw=data,
        )


@dataclass(frozen=True)
class DecisionPayload:
    """What the console signed about one decided ticket."""

    v: int
    tenant: str
    run: int
    generation: int
    ticket: int
    call_id: str
    tool_name: str
    arguments_digest: str
    decision: str
    message: str
    approvers: tuple[str, ...]
    decided_at: str

    @property
    def approved(self) -> bool:
        return self.decision == "approve"

    @classmethod
    def from_json(cls, data: Any) -> DecisionPayload:
        r = _Reader(data, "decision payload")
        return cls(
            v=r.int("v"),
            tenant=r.str("tenant"),
            run=r.int("run"),
            generation=r.int("generation"),
            ticket=r.int("ticket"),
            call_id=r.str("call_id"),
            tool_name=r.str("tool_name"),
            arguments_digest=r.str("arguments_digest"),
            decision=r.str("decision"),
            message=r.str("message", default=""),
            approvers=tuple(str(a) for a in r.get("approvers", list, optional=True) or []),
            decided_at=r.str("decided_at", default=""),
        )


@dataclass(frozen=True)
class SignedDecision:
    payload: DecisionPayload
    key_id: str
    signature: str
    # The payload exactly as received: what the signature covers.
    signed_payload: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> SignedDecision:
        r = _Reader(data, "signed decision")
        signed = r.get("payload", dict)
        return cls(
            payload=DecisionPayload.from_json(signed),
            key_id=r.str("key_id"),
            signature=r.str("signature"),
            signed_payload=signed,
        )


@dataclass(frozen=True)
class Run:
    id: int
    url: str
    status: str
    status_label: str
    status_reason: str
    executor: str
    agent: str
    version: str
    title: str
    generation: int
    requested_by: str | None
    created_at: datetime | None
    updated_at: datetime | None
    finished_at: datetime | None
    final_output: str
    truncated: bool
    tickets: tuple[Ticket, ...] = ()
    decisions: tuple[SignedDecision, ...] = ()
    # The tenant's slug: what signed decisions must name.
    tenant: str | None = None
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def is_waiting(self) -> bool:
        """True while people decide or the console works: nothing for the caller to do yet."""
        return self.status in WAITING_STATUSES

    @classmethod
    def from_json(cls, data: Any) -> Run:
        r = _Reader(data, "run")
        return cls(
            id=r.int("id"),
            url=r.str("url", default=""),
            status=r.str("status"),
            status_label=r.str("status_label", default=""),
            status_reason=r.str("status_reason", default=""),
            executor=r.str("executor"),
            agent=r.str("agent"),
            version=r.str("version"),
            title=r.str("title", default=""),
            generation=r.int("generation"),
            requested_by=r.get("requested_by", str, optional=True),
            created_at=r.time("created_at"),
            updated_at=r.time("updated_at"),
            finished_at=r.time("finished_at"),
            final_output=r.str("final_output", default=""),
            truncated=bool(r.get("truncated", bool, optional=True)),
            tickets=r.list_of("tickets", Ticket.from_json),
            decisions=r.list_of("decisions", SignedDecision.from_json),
            tenant=r.get("tenant", str, optional=True),
            raw=data,
        )


@dataclass(frozen=True)
class PublicKey:
    """One published decision key: `public_key` is the raw 32 bytes."""

    id: str
    algorithm: str
    public_key: bytes
    current: bool


@dataclass(frozen=True)
class Page:
    """One page of a list: `next_cursor` is None on the last."""

    items: tuple[Any, ...]
    next_cursor: str | None


@dataclass(frozen=True)
class AppliedDecisions:
    """What apply_decisions did to the state: resume it with Runner.run(agent, state)."""

    state: Any
    approved: tuple[SignedDecision, ...]
    rejected: tuple[SignedDecision, ...]
