"""Automatic decisions: a policy's rules on argument values, and calls an approver pre-authorised."""

from __future__ import annotations

from approvals import transitions
from approvals.audit import chain
from approvals.decisions import calls, decide, preauth
from approvals.execution import queue
from approvals.live import hints
from approvals.models import (
    Run,
    Ticket,
    TicketStatus,
)
from approvals.policies import quorum, rules, scopes


def decide_automatically(
    run: Run, tickets: list[Ticket], *, now, preauthorised: bool, queue_anyway: bool = False
) -> None:
    """Offer each new ticket to the automatic deciders; queue the run if none is left pending.

    The policy's rules on argument values come first: a call a rule rejects is rejected even if
    an approver pre-authorised it. Then a call an approver edited and pre-authorised (preauth):
    it counts as that person's approval under the ticket's policy, so it approves the ticket
    when one approval is enough and is one vote towards a larger quorum otherwise (where an
    approving rule, if any, still decides). Runs inside the caller's transaction, with the run
    row written (and locked when resuming).

    A flagged call (decisions.calls) is never approved here: a rule may reject it, but an
    approval, by rule or by pre-authorisation, needs a person who saw the flags on its page.
    queue_anyway: the caller decided tickets of this run itself (malformed calls).
    """
    decided, by_person = queue_anyway, None
    for ticket in tickets:
        policy = scopes.policy_of(ticket)
        choice = rules.automatic_decision(policy, ticket.arguments_json)
        if choice is not None and not choice.approve:
            record_automatic(ticket, choice, now=now)
            decided = True
            continue
        if calls.is_flagged(ticket):
            continue
        pre = preauth.candidate(run, ticket, now=now) if preauthorised else None
        if (
            pre is not None
            and not quorum.refusal_for(pre.created_by, ticket, policy)
            and preauth.use(pre, ticket, now=now)
        ):
            progress = decide.vote(ticket, policy, user=pre.created_by, now=now)
            if progress.met:
                preauth.approve(run, ticket, pre, now=now)
                decided, by_person = True, pre.created_by
                continue
            preauth.count_as_vote(run, ticket, pre, progress=progress.describe())
        if choice is not None:
            record_automatic(ticket, choice, now=now)
            decided = True
    if decided:
        queue.queue_if_decided(
            run, now=now, actor=by_person, actor_name="" if by_person else "policy"
        )


def record_automatic(ticket: Ticket, choice: rules.AutoDecision, *, now) -> None:
    status = TicketStatus.APPROVED if choice.approve else TicketStatus.REJECTED
    message = "" if choice.approve else choice.reason[: decide.MAX_MESSAGE_CHARS]
    reason = f"{choice.rule}: {choice.reason}"
    transitions.move_tickets(
        Ticket.objects.filter(pk=ticket.pk),
        to=status,
        decided_at=now,
        decision_message=message,
        decision_source="rule",
        decision_reason=reason,
    )
    ticket.refresh_from_db()
    chain.append_for_ticket(
        ticket,
        action="ticket.auto_approved" if choice.approve else "ticket.auto_rejected",
        actor_name="policy",
        outcome=status,
        detail={
            "rule": choice.rule,
            "reason": choice.reason,
            "policy": ticket.policy.version if ticket.policy_id else 0,
        },
    )
    hints.notify_on_commit(
        ticket.tenant_id, "ticket.decided", ticket=ticket.pk, run=ticket.run_id, status=status
    )
