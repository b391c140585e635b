"""Approver groups: named sets of a tenant's members that policies refer to."""

from __future__ import annotations

from django.db import transaction

from approvals.audit import chain
from approvals.models import (
    DECIDING_ROLES,
    TERMINAL_RUN_STATUSES,
    ApprovalPolicy,
    ApproverGroup,
    Membership,
    Tenant,
    Ticket,
    TicketStatus,
)
from approvals.policies import scopes, versions


def delete_group(*, tenant: Tenant, user, name: str) -> None:
    """Delete an approver group that no current policy names and no open ticket depends on.

    An approved ticket whose run has not resumed yet keeps the policy version it was decided
    under, and the resume checks its voters against that version's groups as they are then:
    deleting a group that version names would void those approvals, so it is refused too.

    Side effects, in one transaction under the tenant's lock (which save_policy also takes, so
    no policy can start naming the group meanwhile): the group row and its memberships; audit
    event group.deleted with its members. Raises versions.PolicyError naming what uses the group,
    writing nothing.
    """
    versions.require_admin(user, tenant.pk)
    name = " ".join((name or "").split())
    if not name or len(name) > 100 or "\x00" in name:
        raise versions.PolicyError("name the group to delete")
    with transaction.atomic():
        Tenant.objects.select_for_update().only("pk").get(pk=tenant.pk)
        group = ApproverGroup.objects.filter(tenant=tenant, name=name).first()
        if group is None:
            raise versions.PolicyError(f"there is no group {name!r}")
        users = [
            str(policy)
            for policy in scopes.current_policies(tenant.pk)
            if name in scopes.groups_named(policy)
        ]
        if users:
            raise versions.PolicyError(
                f"the group {name} is named by {', '.join(users)}; "
                "change those policies first, then delete it"
            )
        # The versions open tickets hold are few, however many the tickets: read those.
        open_tickets = Ticket.objects.filter(
            tenant=tenant, status__in=[TicketStatus.PENDING, TicketStatus.APPROVED]
        ).exclude(run__status__in=TERMINAL_RUN_STATUSES)
        naming = [
            policy.pk
            for policy in ApprovalPolicy.objects.filter(pk__in=open_tickets.values("policy_id"))
            if name in scopes.groups_named(policy)
        ]
        holding = list(
            open_tickets.filter(policy_id__in=naming)
            .order_by("pk")
            .values_list("pk", flat=True)[:6]
        )
        if holding:
            shown = ", ".join(f"#{pk}" for pk in holding[:5]) + (" ..." if len(holding) > 5 else "")
            raise versions.PolicyError(
                f"the group {name} still counts for ticket{'s' if len(holding) > 1 else ''} "
                f"{shown}, decided or pending under an earlier policy version; delete it once "
                "their runs have moved on"
            )
        members = sorted(group.members.values_list("username", flat=True))
        group.delete()
        chain.append(
            tenant_id=tenant.pk,
            action="group.deleted",
            actor=user,
            outcome="deleted",
            detail={"group": name, "removed": members},
        )


def save_group(*, tenant: Tenant, user, name: str, members: list) -> ApproverGroup:
    """Create an approver group, or set the members of an existing one.

    Side effects, in one transaction: the group row and its members (only members of the
    tenant are kept); audit event group.changed. Raises versions.PolicyError, writing nothing,
    for a bad name or a member whose role may not decide (only approvers and admins may).
    """
    versions.require_admin(user, tenant.pk)
    name = " ".join((name or "").split())
    if not name or len(name) > 100:
        raise versions.PolicyError("a group needs a name of at most 100 characters")
    memberships = Membership.objects.filter(tenant=tenant, user__in=members).select_related("user")
    # A group's members are counted as approvals: someone whose role may not decide would be
    # a voter who can never vote.
    refused = sorted(
        f"{m.user.get_username()} ({m.role})" for m in memberships if m.role not in DECIDING_ROLES
    )
    if refused:
        raise versions.PolicyError(
            f"{', '.join(refused)} may not decide tickets; a group holds only approvers and "
            "admins: change their role first"
        )
    member_ids = {m.user_id for m in memberships}
    with transaction.atomic():
        group, created = ApproverGroup.objects.get_or_create(tenant=tenant, name=name)
        before = set(group.members.values_list("username", flat=True))
        group.members.set(member_ids)
        after = set(group.members.values_list("username", flat=True))
        chain.append(
            tenant_id=tenant.pk,
            action="group.changed",
            actor=user,
            outcome="created" if created else "changed",
            detail={
                "group": name,
                "added": sorted(after - before),
                "removed": sorted(before - after),
            },
        )
    return group
