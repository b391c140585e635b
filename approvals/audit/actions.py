"""Every audit action, once: what a person reads for it, which live hint it sends and which
notification it is.

audit.chain.append() refuses an action that is not here, so the run timeline, the audit
filters, the live hints and the notifications cannot drift apart. The apps that listen to
approvals (notifications, sessions_admin) write their actions here too: the audit log is one
vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    # How the history says it: a format whose {fields} are the event's own (actor, ticket, run,
    # tool, outcome) or keys of its detail (audit.sentences renders it, as text, escaped). ""
    # reads as the generic sentence.
    sentence: str = ""
    # The filter's group; "" takes it from the name's prefix (AREAS).
    area: str = ""


_ACTIONS = [
    # A run the console runs, started over the API or a command: waiting for a worker.
    Action("run.started", "Started: waiting for a worker", RUN_CHANGED),
    Action("run.starting", "Worker running the agent", RUN_CHANGED),
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
    # Accounts (the accounts app, on django-allauth): each sign-in with its method (password,
    # sso with the provider, passkey) and second factor; a refused one says why.
    Action("auth.signed_in", "Signed in", "auth.signed_in"),
    Action("auth.signed_out", "Signed out", "auth.signed_out"),
    Action("auth.sign_in_refused", "Sign-in refused", "auth.sign_in_refused"),
    Action("auth.sessions_ended", "Sessions signed out", "auth.sessions_ended"),
    Action("auth.step_up", "Second factor confirmed", "auth.step_up"),
    Action("auth.settings_changed", "Sign-in settings changed", MEMBER_CHANGED),
    Action("auth.sso_role_mapped", "Single sign-on group mapped", MEMBER_CHANGED),
    Action("auth.sso_role_unmapped", "Single sign-on group unmapped", MEMBER_CHANGED),
    Action("mfa.enrolled", "Two-factor method added", MEMBER_CHANGED),
    Action("mfa.removed", "Two-factor method removed", MEMBER_CHANGED),
    Action("mfa.recovery_codes_reset", "Recovery codes regenerated", "mfa.recovery_codes_reset"),
    Action("mfa.recovery_code_used", "Recovery code used", "mfa.recovery_code_used"),
    Action("mfa.failed", "Second factor failed", "mfa.failed"),
    Action("audit.exported", "History exported", "audit.exported"),
    Action("audit.record_exported", "Decision record exported", "audit.exported"),
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

# The sentence column of the table, by action. Fields: {actor}, {ticket} ("ticket #12"), {run}
# ("run #3"), {tool}, {outcome}, and any key of the event's detail; the detail keys a sentence
# does not use are listed under it.
SENTENCES: dict[str, str] = {
    "tenant.created": "{actor} created the tenant {name} ({slug})",
    "member.added": "{actor} added {user} as {role}",
    "member.removed": "{actor} removed {user} (was {role})",
    "member.role_changed": "{actor} changed the role of {user} from {from} to {to}",
    "invitation.sent": "{actor} invited {email} as {role}",
    "invitation.accepted": "{user} accepted the invitation sent to {email} and joined as {role}",
    "invitation.revoked": "{actor} revoked the invitation of {email} as {role}",
    "run.paused": "{run} paused for approval: {tickets} call(s) waiting",
    "ticket.created": "{actor} asked to run {tool} ({ticket})",
    "ticket.approved": "{actor} approved {tool} on {ticket}",
    "ticket.rejected": "{actor} rejected {tool} on {ticket}",
    "ticket.edited": "{actor} rejected {tool} on {ticket} with corrected arguments, "
    "pre-authorised for the agent's next call",
    "ticket.preauthorised": "{tool} on {ticket} approved by the pre-authorisation "
    "{preauthorised_by} made when editing ticket #{original_ticket}",
    "ticket.expired": "{ticket} ({tool}) expired undecided",
    "ticket.malformed": "{ticket} ({tool}) rejected: the call does not fit its tool",
    "ticket.vote": "{actor} approved {tool} on {ticket}: {progress}",
    "ticket.votes_invalidated": "Approvals by {voters} on {ticket} invalidated: "
    "policy v{from} → v{to}",
    "ticket.escalated": "{ticket} ({tool}) escalated to {group}",
    "ticket.auto_approved": "{ticket} ({tool}) approved automatically by rule {rule}",
    "ticket.auto_rejected": "{ticket} ({tool}) rejected automatically by rule {rule}",
    "ticket.claimed": "{actor} said they are on {ticket}",
    "ticket.released": "{actor} released their claim on {ticket}",
    "ticket.commented": "{actor} commented on {ticket}: “{text}”",
    "policy.changed": "{actor} changed the policy for {scope} to v{version}",
    "policy.removed": "{actor} removed the policy v{removed} for {scope}",
    "group.changed": "{actor} changed the approver group {group}",
    "group.deleted": "{actor} deleted the approver group {group}",
    "run.started": "{actor} started {run} (agent {agent} v{version}): waiting for a worker",
    "run.starting": "{actor} running the agent of {run}, attempt {attempt}",
    "run.queued": "{run} queued for the worker",
    "run.awaiting_caller": "{run} decided: waiting for its caller to resume it",
    "run.resuming": "{actor} resuming {run}, attempt {attempt}",
    "effect.done": "{actor} ran {tool} for {ticket} on {resource}",
    "run.completed": "{run} completed",
    "run.failed": "{run} failed: {reason}",
    "run.refused": "{actor} refused to resume {run}: {reason}",
    "run.in_doubt": "{run} waits for a person: an effect's outcome is in doubt",
    "run.expired": "{run} expired",
    "run.requeued": "{run} re-queued: {reason}",
    "run.retry_later": "{run} waits to retry: {reason}",
    "run.resolved": "{actor} resolved {run} as {resolution}",
    "keys.rotated": "{actor} re-sealed {runs} run state(s) under key {key}",
    "auth.sign_in_failed": "Sign-in failed for {actor}",
    "auth.locked_out": "{actor} locked out after repeated failed sign-ins",
    "auth.signed_in": "{actor} signed in with {method}",
    "auth.signed_out": "{actor} signed out",
    "auth.sign_in_refused": "Sign-in of {actor} refused: {reason}",
    "auth.sessions_ended": "{actor} signed out {sessions} session(s) of {user}: {reason}",
    "auth.step_up": "{actor} confirmed a second factor ({type}) {purpose}",
    "auth.settings_changed": "{actor} changed the sign-in settings: {changes}",
    "auth.sso_role_mapped": "{actor} mapped the {provider} group {group} to {role}",
    "auth.sso_role_unmapped": "{actor} removed the mapping of the {provider} group {group}",
    "mfa.enrolled": "{actor} added a two-factor method: {type}",
    "mfa.removed": "{actor} removed a two-factor method: {type}",
    "mfa.recovery_codes_reset": "{actor} generated new recovery codes",
    "mfa.recovery_code_used": "{actor} used a recovery code ({left} left)",
    "mfa.failed": "A second factor ({type}) of {actor} was refused",
    "audit.exported": "{actor} exported the audit history as {format}",
    "audit.record_exported": "{actor} exported the decision record of {ticket} as {format}",
    "audit.checkpointed": "{actor} signed a checkpoint of the chain at event #{seq}",
    "session.cleared": "{actor} cleared session {session_id} in the {store} store: {items} item(s)",
    "webhook.created": "{actor} created webhook #{endpoint} to {host}",
    "webhook.changed": "{actor} changed webhook #{endpoint} to {host}",
    "webhook.deleted": "{actor} deleted webhook #{endpoint} to {host}",
    "webhook.delivered": "Webhook #{endpoint} received {event} (delivery #{delivery})",
    "webhook.failed": "Webhook #{endpoint} did not receive {event} (delivery #{delivery})",
    "webhook.retried": "{actor} retried delivery #{delivery} of {event} to webhook #{endpoint}",
    "webhook.pinged": "{actor} sent a test event to webhook #{endpoint} ({host})",
    "token.created": "{actor} created API token {name} ({prefix})",
    "token.revoked": "{actor} revoked API token {name} ({prefix})",
    "token.used": "{actor} used the API: {method} {path}",
    "email.failed": "Email of {event} to {recipient} failed",
    "email.retried": "{actor} retried the email of {event} to {recipient}",
}

# The filter's groups, in the order it shows them: the name's prefix -> area.
AREAS: dict[str, str] = {
    "ticket": "Tickets",
    "run": "Runs",
    "effect": "Runs",
    "policy": "Policies",
    "group": "Policies",
    "tenant": "Members",
    "member": "Members",
    "membership": "Members",
    "invite": "Members",
    "invitation": "Members",
    "session": "Sessions",
    "token": "API",
    "auth": "Sign-in",
    "mfa": "Sign-in",
    "webhook": "Notifications",
    "email": "Notifications",
    "audit": "Audit log",
    "keys": "Keys",
}
OTHER_AREA = "Other"


def _area(action: Action) -> str:
    return action.area or AREAS.get(action.name.split(".", 1)[0], OTHER_AREA)


ACTIONS: dict[str, Action] = {
    action.name: replace(
        action,
        sentence=action.sentence or SENTENCES.get(action.name, ""),
        area=_area(action),
    )
    for action in _ACTIONS
}


def grouped() -> list[tuple[str, list[Action]]]:
    """The actions by area, for the history's filter: areas in AREAS order (then Other), each
    area's actions by label."""
    order = list(dict.fromkeys([*AREAS.values(), OTHER_AREA]))
    groups: dict[str, list[Action]] = {}
    for action in ACTIONS.values():
        groups.setdefault(action.area, []).append(action)
    return [
        (area, sorted(groups[area], key=lambda a: a.label))
        for area in sorted(groups, key=lambda a: order.index(a) if a in order else len(order))
    ]


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
            # accounts
            "signed_in",
            "signed_out",
            "refused",
            "ended",
            "confirmed",
            "enrolled",
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
