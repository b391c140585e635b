"""Rows of the approval console, one module per area. Facts about one row live here; anything
that touches several rows, writes the audit log or enqueues work is in a capability module.

Django finds the models through this package, so each is re-exported here."""

from __future__ import annotations

from approvals.models.audit import AuditEvent
from approvals.models.ledger import IdempotencyRecord, LedgerStatus
from approvals.models.policies import ApprovalPolicy, ApproverGroup, ExpiryAction
from approvals.models.runs import TERMINAL_RUN_STATUSES, Run, RunExecutor, RunStatus
from approvals.models.tenants import (
    COMMENTING_ROLES,
    DECIDING_ROLES,
    HISTORY_ROLES,
    Invitation,
    Membership,
    Role,
    Tenant,
)
from approvals.models.tickets import (
    CLAIM_LAPSE,
    PreAuthorization,
    Ticket,
    TicketStatus,
    TicketVote,
)
from approvals.models.workers import WorkerHeartbeat

__all__ = [
    "CLAIM_LAPSE",
    "COMMENTING_ROLES",
    "DECIDING_ROLES",
    "HISTORY_ROLES",
    "TERMINAL_RUN_STATUSES",
    "ApprovalPolicy",
    "ApproverGroup",
    "AuditEvent",
    "ExpiryAction",
    "IdempotencyRecord",
    "Invitation",
    "LedgerStatus",
    "Membership",
    "PreAuthorization",
    "Role",
    "Run",
    "RunExecutor",
    "RunStatus",
    "Tenant",
    "Ticket",
    "TicketStatus",
    "TicketVote",
    "WorkerHeartbeat",
]
