"""Every audit action, once: what a person reads for it, which live hint it sends and which
notification it is.

audit.chain.append() refuses an action that is not here, so the run timeline, the audit
filters, the live hints and the notifications cannot drift apart. The apps that listen to
approvals (notifications, sessions_admin) write their actions here too: the audit log is one
vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

from approvals.models import RunStatus, TicketStatus

# Live hint kinds (console.js re-reads on them).
TICKET_CREATED = "ticket.created"
TICKET_DECIDED = "ticket.decided"
TICKET_CHANGED = "ticket.changed"
RUN_CHANGED = "run.changed"
# Delivery hints go to the tenant's admins only: they alone see the delivery and email logs.
DELIVERY_CHANGED = "delivery.changed"
# A tenant's members changed: pages re-read what the reader may see and do.
MEMBER_CHANGED = "member.changed"


@dataclass(frozen=True)
class Action:
    name: str
    label: str
    live: str = ""  # the hint kind pages re-read on; "" sends none
    notify: str = ""  # the notification event (notifications.models.Event); "" notifies no one


_ACTIONS = [
    Action("run.paused", "Paused for approval", RUN_CHANGED),
    Action("ticket.created", "Approval requested", TICKET_CREATED, notify="ticket.created"),
    Action("ticket.approved", "Approved", TICKET_DECIDED, notify="ticket.decided"),
    # An expiry that rejects is a ticket.rejected with detail by=expiry: notifications call it an
    # expiry (notifications.events).
    Action("ticket.rejected", "Rejected", TICKET_DECIDED, notify="ticket.decided"),
    Action(
        "ticket.edited",
        "Edited: rejected with corrected arguments",
        TICKET_DECIDED,
        notify="ticket.decided",
    ),
    Action(
        "ticket.preauthorised",
        "Approved: pre-authorised edit",
        TICKET_DECIDED,
        notify="ticket.decided",
    ),
    Action("ticket.expired", "Ticket expired", TICKET_DECIDED, notify="ticket.expired"),
    Action(
        "ticket.malformed",
        "Rejected: the call does not fit its tool",
        TICKET_DECIDED,
        notify="ticket.decided",
    ),
    Action("ticket.vote", "Approval counted towards the quorum", TICKET_CHANGED),
    Action("ticket.votes_invalidated", "Approvals invalidated by a policy change", TICKET_CHANGED),
    Action("ticket.escalated", "Escalated", TICKET_CHANGED, notify="ticket.escalated"),
    Action(
        "ticket.auto_approved",
        "Approved automatically by rule",
        TICKET_DECIDED,
        notify="ticket.decided",
    ),
    Action(
        "ticket.auto_rejected",
        "Rejected automatically by rule",
        TICKET_DECIDED,
        notify="ticket.decided",
    ),
    Action("ticket.claimed", "Claimed", TICKET_CHANGED),
    Action("ticket.released", "Claim released", TICKET_CHANGED),
    Action("ticket.commented", "Comment", TICKET_CHANGED),
    Action("policy.changed", "Policy changed", "policy.changed"),
    Action("policy.removed", "Policy removed", "policy.removed"),
    Action("group.changed", "Approver group changed", "group.changed"),
    Action("group.deleted", "Approver group deleted", "group.deleted"),
    Action("run.queued", "Queued for the worker", RUN_CHANGED),
    # A caller's run, every ticket decided: its caller fetches the signed decisions and resumes.
    Action(
        "run.awaiting_caller", "Decided: waiting for the caller", RUN_CHANGED, notify="run.decided"
    ),
    Action("run.resuming", "Worker resuming", RUN_CHANGED),
    Action("effect.done", "Effect done", RUN_CHANGED),
    Action("run.completed", "Completed", RUN_CHANGED, notify="run.completed"),
    Action("run.failed", "Failed", RUN_CHANGED, notify="run.failed"),
    Action("run.refused", "Refused by the worker", RUN_CHANGED),
    Action("run.in_doubt", "Effect in doubt", RUN_CHANGED, notify="run.failed"),
    Action("run.expired", "Expired", RUN_CHANGED, notify="run.failed"),
    Action("run.requeued", "Re-queued after a worker stopped", RUN_CHANGED),
    Action("run.retry_later", "Waiting to retry", RUN_CHANGED),
    Action("run.resolved", "Resolved by a person", RUN_CHANGED),
    Action("keys.rotated", "Keys rotated", "keys.rotated"),
    Action("auth.sign_in_failed", "Sign-in failed", "auth.sign_in_failed"),
    Action("auth.locked_out", "Sign-in locked out", "auth.locked_out"),
    Action("audit.exported", "History exported", "audit.exported"),
    # Delivered with its signed statement by the audit_checkpointed signal (approvals.signals),
    # not by the plain fan-out of audit events.
    Action(
        "audit.checkpointed",
        "Audit checkpoint signed",
        "audit.checkpointed",
        notify="audit.checkpoint",
    ),
    Action("session.cleared", "Session cleared", "session.cleared"),
    Action("webhook.created", "Webhook created", DELIVERY_CHANGED),
    Action("webhook.changed", "Webhook changed", DELIVERY_CHANGED),
    Action("webhook.deleted", "Webhook deleted", DELIVERY_CHANGED),
    Action("webhook.delivered", "Webhook delivered", DELIVERY_CHANGED),
    Action("webhook.failed", "Webhook delivery failed", DELIVERY_CHANGED),
    Action("webhook.retried", "Webhook delivery retried", DELIVERY_CHANGED),
    Action("webhook.pinged", "Webhook test event sent", DELIVERY_CHANGED),
    # API tokens (the api app): issued and revoked by admins; their use is one event per token
    # per minute window (api.tokens.record_use), and each change made over the API is its own
    # action with detail via=api and the token's prefix.
    Action("token.created", "API token created", "token.changed"),
    Action("token.revoked", "API token revoked", "token.changed"),
    Action("token.used", "API token used", "token.changed"),
    # Tenants and their members (approvals.tenancy): the operator's commands, or a page.
    Action("tenant.created", "Tenant created", MEMBER_CHANGED),
    Action("member.added", "Member added", MEMBER_CHANGED),
    Action("member.removed", "Member removed", MEMBER_CHANGED),
    Action("member.role_changed", "Member's role changed", MEMBER_CHANGED),
    # Invitations by email (approvals.invitations): sent and revoked by an admin, accepted by
    # the invitee through the link (who then also appears in a member.added).
    Action("invitation.sent", "Invitation sent", MEMBER_CHANGED),
    Action("invitation.accepted", "Invitation accepted", MEMBER_CHANGED),
    Action("invitation.revoked", "Invitation revoked", MEMBER_CHANGED),
    Action("email.failed", "Notification email failed", DELIVERY_CHANGED),
    Action("email.retried", "Notification email retried", DELIVERY_CHANGED),
]

ACTIONS: dict[str, Action] = {action.name: action for action in _ACTIONS}

# Every outcome an event may record, for the history's filter.
OUTCOMES: tuple[str, ...] = tuple(
    sorted(
        {
            *RunStatus.values,
            *TicketStatus.values,
            "done",
            "failed",
            "rotated",
            "exported",
            "checkpointed",
            "cleared",
            "locked_out",
            "changed",
            "created",
            "added",
            "removed",
            # webhooks (notifications)
            "active",
            "inactive",
            "deleted",
            "delivered",
            # API tokens (api)
            "revoked",
            "used",
            # invitations (approvals.invitations)
            "sent",
            "accepted",
        }
    )
)


class UnknownActionError(ValueError):
    """An action missing from the table: a bug in the code that appends it."""


def get(name: str) -> Action:
    try:
        return ACTIONS[name]
    except KeyError:
        raise UnknownActionError(
            f"{name!r} is not an audit action (approvals.audit.actions)"
        ) from None


def label(name: str) -> str:
    """What a person reads for the action; an unknown one (from an older version) reads as is."""
    action = ACTIONS.get(name)
    return action.label if action else name
