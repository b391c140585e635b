"""What must hold before the worker uses any of a run's stored state; a refusal parks the run."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import F, FilteredRelation, Q, QuerySet
from django.utils import timezone

from approvals import members
from approvals.core import statements
from approvals.execution import registry
from approvals.models import (
    Run,
    RunStatus,
    Ticket,
    TicketStatus,
    TicketVote,
)
from approvals.policies import quorum, scopes

REGENERATE = "Regenerate the approval"


class Refusal(Exception):
    """The worker will not run this state; the run is parked with the reason."""

    def __init__(self, reason: str, status: str = RunStatus.NEEDS_ATTENTION) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class Unavailable(Exception):
    """Something the run needs is unreachable right now; nothing ran, so it can wait and retry."""


# The columns of a vote and of its voter that decided_tickets() reads with each ticket, each
# under a name of its own: (attribute, the annotation's name).
_VOTE_COLUMNS = [(f.attname, f"vote_{f.attname}") for f in TicketVote._meta.concrete_fields]
_VOTER_COLUMNS = [(f.attname, f"voter_{f.attname}") for f in get_user_model()._meta.concrete_fields]


def decided_tickets(run: Run) -> tuple[list[Ticket], dict[int, list[TicketVote]]]:
    """The tickets of the run's current state (in pk order, each with its decider) and the
    valid votes on each (in pk order, each with its voter and the voter's role in the tenant
    now, as check_before_resume() needs them): one query, written once per process. A ticket
    without a valid vote has an empty list."""
    values = {"run": run.pk, "generation": run.state_generation, "tenant": run.tenant_id}
    tickets: dict[int, Ticket] = {}
    votes_of: dict[int, list[TicketVote]] = {}
    users = get_user_model()
    for row in statements.objects("checks.decided_tickets", _decided_tickets, values):
        ticket = tickets.setdefault(row.pk, row)
        votes = votes_of.setdefault(row.pk, [])
        vote_values = [getattr(row, name) for _, name in _VOTE_COLUMNS]
        voter_values = [getattr(row, name) for _, name in _VOTER_COLUMNS]
        role = row.voter_role
        for _, name in (*_VOTE_COLUMNS, *_VOTER_COLUMNS, (None, "voter_role")):
            delattr(row, name)
        if vote_values[0] is None:
            continue
        vote = TicketVote.from_db(ticket._state.db, [a for a, _ in _VOTE_COLUMNS], vote_values)
        vote.user = users.from_db(ticket._state.db, [a for a, _ in _VOTER_COLUMNS], voter_values)
        vote.voter_role = role
        votes.append(vote)
    return list(tickets.values()), votes_of


def _decided_tickets(values) -> QuerySet[Ticket]:
    """decided_tickets()'s read: a row for each valid vote on each ticket (one with no vote for
    a ticket without), the vote's and its voter's columns as annotations."""
    return (
        Ticket.objects.filter(run_id=values["run"], generation=values["generation"])
        .select_related("decided_by")
        .annotate(
            valid_vote=FilteredRelation("votes", condition=Q(votes__invalidated_at__isnull=True))
        )
        .annotate(
            **{name: F(f"valid_vote__{attname}") for attname, name in _VOTE_COLUMNS},
            **{name: F(f"valid_vote__user__{attname}") for attname, name in _VOTER_COLUMNS},
            voter_role=members.role_in(values["tenant"], "valid_vote__user_id"),
        )
        .order_by("pk", "valid_vote__id")
    )


def check_before_resume(
    run: Run, tickets: list[Ticket], votes_of: dict[int, list[TicketVote]] | None = None
) -> None:
    """Everything that must hold before any of the stored state is used. votes_of: the valid
    votes on each ticket as decided_tickets() reads them; read here when not given."""
    if run.attempts > settings.APPROVALS_MAX_ATTEMPTS:
        raise Refusal(
            f"resumed {run.attempts - 1} times without finishing; look at the worker logs"
        )
    if not tickets:
        raise Refusal("the run has no tickets for its current state")
    undecided = [
        t for t in tickets if t.status not in (TicketStatus.APPROVED, TicketStatus.REJECTED)
    ]
    if undecided:
        raise Refusal(f"ticket {undecided[0].pk} is {undecided[0].status}, not decided")
    now = timezone.now()
    grace = timedelta(seconds=settings.APPROVALS_RESUME_GRACE_SECONDS)
    # The run waits for its last ticket, whose expiry may be later than its siblings' (another
    # policy, an escalation): an approval is stale only once the whole generation has expired.
    deadline = max(t.expires_at for t in tickets)
    for ticket in tickets:
        if ticket.status == TicketStatus.REJECTED and ticket.decision_source == "expiry":
            # Rejected because it expired: the decision is the expiry itself, and runs nothing.
            continue
        if ticket.decided_at is None or ticket.decided_at > ticket.expires_at:
            raise Refusal(
                f"{REGENERATE}: ticket {ticket.pk} was decided after it expired", RunStatus.EXPIRED
            )
        # A decision is good until the tickets' expiry; a resume that starts much later must
        # not act on a stale approval. A rejection runs nothing, so it never goes stale.
        if ticket.status == TicketStatus.APPROVED and now > deadline + grace:
            raise Refusal(
                f"{REGENERATE}: ticket {ticket.pk} expired at "
                f"{deadline:%Y-%m-%d %H:%M:%S} UTC before the run could resume",
                RunStatus.EXPIRED,
            )
    approved = [
        t for t in tickets if t.status == TicketStatus.APPROVED and t.decision_source != "rule"
    ]
    if approved:
        _check_approvals(run, approved, votes_of)
    blocker = registry.resume_blocker(run)
    if blocker:
        raise Refusal(f"{REGENERATE}: {blocker}")


def _votes(values) -> QuerySet[TicketVote]:
    """The valid votes on the tickets named ticket0, ticket1, ... with each voter and the
    voter's role in the tenant now (written once per process and number of tickets)."""
    tickets = [value for name, value in values.items() if name.startswith("ticket")]
    return (
        TicketVote.objects.filter(ticket_id__in=tickets, invalidated_at__isnull=True)
        .select_related("user")
        .annotate(voter_role=members.role_in(values["tenant"]))
        .order_by("pk")
    )


def _check_approvals(
    run: Run, approved: list[Ticket], known: dict[int, list[TicketVote]] | None
) -> None:
    """Each approval still stands: its approver and every voter whose approval counted may still
    approve (membership and groups as they are now), none of them requested the call, and the
    quorum is still met. One query for all the tickets: their votes, each with its voter's
    membership as it is now; a second only for approvers who have no vote among them."""
    votes_of: dict[int, list[TicketVote]] = {t.pk: [] for t in approved}
    memberships = {}
    if known is None:
        values = {"tenant": run.tenant_id, **{f"ticket{n}": t.pk for n, t in enumerate(approved)}}
        read = statements.objects(("checks.votes", len(approved)), _votes, values)
    else:
        read = [vote for t in approved for vote in known.get(t.pk, [])]
    for vote in read:
        votes_of[vote.ticket_id].append(vote)
        membership = members.membership_from_role(vote.user, run.tenant_id, vote.voter_role)
        if membership is not None:
            memberships[vote.user_id] = membership
    voters = {vote.user_id for votes in votes_of.values() for vote in votes}
    deciders = [t.decided_by for t in approved if t.decided_by and t.decided_by_id not in voters]
    if deciders:
        memberships.update(members.memberships_in(deciders, run.tenant_id))
    for ticket in approved:
        approver = ticket.decided_by
        membership = memberships.get(approver.pk) if approver else None
        if membership is None or not membership.can_decide:
            who = approver.get_username() if approver else "a deleted user"
            raise Refusal(
                f"{REGENERATE}: {who}, who approved ticket {ticket.pk}, may no longer approve"
            )
        if ticket.is_requested_by(approver):
            raise Refusal(f"{REGENERATE}: ticket {ticket.pk} was approved by its requester")
        # Every vote of a quorum counts, so each voter must still hold, not only the last.
        votes = votes_of[ticket.pk]
        for vote in votes:
            voter = memberships.get(vote.user_id)
            if voter is None or not voter.can_decide or ticket.is_requested_by(vote.user):
                raise Refusal(
                    f"{REGENERATE}: {vote.user.get_username()}, whose approval counted for "
                    f"ticket {ticket.pk}, may no longer approve"
                )
        # Group membership counts as it is now, not as it was at the vote: someone taken
        # out of a group since no longer speaks for it.
        policy = scopes.policy_of(ticket)
        if policy.group_rules or policy.allowed_groups or policy.escalation_group:
            for vote in votes:
                now_in = quorum.groups_of(vote.user, run.tenant_id)
                vote.groups = [g for g in vote.groups if g in now_in]
                why = quorum.vote_refusal(vote, now_in, ticket, policy)
                if why:
                    raise Refusal(
                        f"{REGENERATE}: {vote.user.get_username()}, whose approval counted "
                        f"for ticket {ticket.pk}, may no longer approve it: {why}"
                    )
        # And the quorum itself: a voter whose account was deleted took the vote along.
        if policy.required_approvals > 1 or policy.group_rules:
            progress = quorum.progress(ticket, policy, votes)
            if not progress.met:
                raise Refusal(
                    f"{REGENERATE}: ticket {ticket.pk} no longer has the approvals its "
                    f"policy needs ({progress.describe()})"
                )
