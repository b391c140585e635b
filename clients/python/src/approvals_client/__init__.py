"""Client of the approval console's HTTP API (docs/API.md): start runs in the console, or hand
over your own paused run, wait for people to decide, verify their signed decisions against your
own state and resume it. No Django needed."""

from __future__ import annotations

from approvals_client.aio import AsyncApprovalsClient
from approvals_client.client import ApprovalsClient
from approvals_client.decisions import arguments_digest, canonical_json
from approvals_client.errors import ApiError, ApprovalsError, DecisionRefused, WaitTimeout
from approvals_client.models import (
    AppliedDecisions,
    Approvals,
    DecisionPayload,
    Page,
    PublicKey,
    Run,
    SignedDecision,
    Ticket,
)

__version__ = "0.1.0"

__all__ = [
    "ApiError",
    "AppliedDecisions",
    "Approvals",
    "ApprovalsClient",
    "ApprovalsError",
    "AsyncApprovalsClient",
    "DecisionPayload",
    "DecisionRefused",
    "Page",
    "PublicKey",
    "Run",
    "SignedDecision",
    "Ticket",
    "WaitTimeout",
    "arguments_digest",
    "canonical_json",
]
