"""Signed decisions, checked against the caller's own state, then applied to it.

Everything here is free of I/O: both clients fetch the keys and the run, then call check() and
apply(). A decision is applied only when every decision of the run passes every check and every
interruption of the state has one; otherwise DecisionRefused says why and the state is untouched.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agents import RunState
from agents.items import ToolApprovalItem
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from approvals_client.errors import ApiError, DecisionRefused
from approvals_client.models import (
    AppliedDecisions,
    DecisionPayload,
    PublicKey,
    Run,
    SignedDecision,
)

PAYLOAD_VERSION = 1
ALGORITHM = "Ed25519"
UNPARSED = "__unparsed__"


# --- canonical JSON and the arguments digest (docs/API.md, SignedDecision) ----------------------


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class _DuplicateKey(ValueError):
    pass


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def arguments_digest(raw: str | None) -> str:
    """SHA-256 hex of the canonical arguments of a call, exactly as the console takes it.

    An empty string is {}; text that is not JSON, or repeats a key, is {"__unparsed__": raw}.
    """
    if raw is None or raw == "":
        value: Any = {}
    else:
        try:
            value = json.loads(raw, object_pairs_hook=_refuse_duplicates)
        except (ValueError, RecursionError):
            value = {UNPARSED: raw}
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


# --- keys and signatures ------------------------------------------------------------------------

_BASE64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")


def decode_base64url(text: str) -> bytes:
    """URL-safe base64, padding optional; ValueError for anything else."""
    if not _BASE64URL.fullmatch(text):
        raise ValueError("not URL-safe base64")
    try:
        return base64.urlsafe_b64decode(text.rstrip("=") + "=" * (-len(text.rstrip("=")) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not URL-safe base64") from None


def parse_keys(data: Any) -> dict[str, PublicKey]:
    """The Ed25519 keys of a GET /keys answer, by id. Keys of another algorithm are left out."""
    if not isinstance(data, Mapping) or not isinstance(data.get("keys"), list):
        raise ApiError(200, "the answer of /keys has no list of keys", "bad_answer")
    keys: dict[str, PublicKey] = {}
    for entry in data["keys"]:
        if not isinstance(entry, Mapping) or entry.get("algorithm") != ALGORITHM:
            continue
        key_id, encoded = entry.get("id"), entry.get("public_key")
        if not isinstance(key_id, str) or not isinstance(encoded, str):
            continue
        try:
            raw = decode_base64url(encoded)
        except ValueError:
            continue
        if len(raw) == 32:
            keys[key_id] = PublicKey(key_id, ALGORITHM, raw, bool(entry.get("current")))
    return keys


def unknown_key_ids(decisions: Iterable[SignedDecision], keys: Mapping[str, PublicKey]) -> set[str]:
    return {d.key_id for d in decisions} - set(keys)


def verify_signature(decision: SignedDecision, keys: Mapping[str, PublicKey]) -> None:
    """Raises DecisionRefused unless a published key of the decision's key_id signed its payload."""
    key = keys.get(decision.key_id)
    if key is None:
        raise DecisionRefused(
            f"the decision on call {decision.payload.call_id!r} is signed with key "
            f"{decision.key_id!r}, which the console does not publish"
        )
    try:
        signature = decode_base64url(decision.signature)
        message = canonical_json(dict(decision.signed_payload)).encode("utf-8")
        Ed25519PublicKey.from_public_bytes(key.public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        raise DecisionRefused(
            f"the signature of the decision on call {decision.payload.call_id!r} does not verify "
            f"with key {decision.key_id!r}"
        ) from None


# --- the caller's own state ---------------------------------------------------------------------


def own_state(state: Any) -> RunState:
    if not isinstance(state, RunState):
        raise TypeError(
            "apply_decisions needs the RunState you will resume (result.to_state()), "
            f"not {type(state).__name__}"
        )
    return state


def _names(item: ToolApprovalItem) -> set[str]:
    return {name for name in (item.name, item.qualified_name, item.tool_name) if name}


@dataclass(frozen=True)
class _Planned:
    item: ToolApprovalItem
    decision: SignedDecision


def check(
    state: RunState,
    run: Run,
    decisions: Iterable[SignedDecision],
    keys: Mapping[str, PublicKey],
) -> list[_Planned]:
    """Every decision checked against the published keys, the run the caller holds and the
    caller's own interruptions. Changes nothing. Raises DecisionRefused with the first reason.
    """
    decisions = list(decisions)
    interruptions = state.get_interruptions()
    if not interruptions:
        raise DecisionRefused("the state has no interruptions: there is nothing to decide")
    by_call: dict[str, ToolApprovalItem] = {}
    for item in interruptions:
        if not item.call_id or item.call_id in by_call:
            raise DecisionRefused(
                f"the state's interruptions do not each have their own call id ({item.call_id!r})"
            )
        by_call[item.call_id] = item
    if not decisions:
        raise DecisionRefused(
            f"run {run.id} is {run.status} and carries no decisions: they are not all in yet"
        )
    if run.tenant is None:
        raise DecisionRefused(f"run {run.id} does not name its tenant: decisions cannot be bound")

    planned: dict[str, _Planned] = {}
    for decision in decisions:
        verify_signature(decision, keys)
        payload: DecisionPayload = decision.payload
        call = f"the decision on call {payload.call_id!r}"
        if payload.v != PAYLOAD_VERSION:
            raise DecisionRefused(f"{call} has payload version {payload.v}, not {PAYLOAD_VERSION}")
        if payload.tenant != run.tenant:
            raise DecisionRefused(f"{call} is for tenant {payload.tenant!r}, not {run.tenant!r}")
        if payload.run != run.id:
            raise DecisionRefused(f"{call} is for run {payload.run}, not run {run.id}")
        if payload.generation != run.generation:
            raise DecisionRefused(
                f"{call} is for generation {payload.generation} of run {run.id}, "
                f"not generation {run.generation}"
            )
        if payload.decision not in ("approve", "reject"):
            raise DecisionRefused(f"{call} says {payload.decision!r}, not approve or reject")
        item = by_call.get(payload.call_id)
        if item is None:
            raise DecisionRefused(f"{call} names no interruption of this state")
        if payload.call_id in planned:
            raise DecisionRefused(f"call {payload.call_id!r} has more than one decision")
        if payload.tool_name not in _names(item):
            raise DecisionRefused(
                f"{call} is about tool {payload.tool_name!r}, but the state calls "
                f"{item.qualified_name or item.name!r}"
            )
        if arguments_digest(item.arguments) != payload.arguments_digest:
            raise DecisionRefused(
                f"{call} was made on other arguments than those in this state "
                "(the arguments digest differs)"
            )
        planned[payload.call_id] = _Planned(item, decision)

    missing = sorted(set(by_call) - set(planned))
    if missing:
        raise DecisionRefused(f"no decision for the interruptions {missing}")
    return list(planned.values())


def apply(state: RunState, planned: list[_Planned]) -> AppliedDecisions:
    """Approve or reject each checked interruption on the state (the SDK's RunState methods)."""
    approved, rejected = [], []
    for step in planned:
        payload = step.decision.payload
        if payload.approved:
            state.approve(step.item)
            approved.append(step.decision)
        else:
            # An empty message lets the SDK's default rejection text reach the model.
            state.reject(step.item, rejection_message=payload.message or None)
            rejected.append(step.decision)
    return AppliedDecisions(state=state, approved=tuple(approved), rejected=tuple(rejected))
