"""Who a user is in a tenant: their membership, the one place capabilities look it up."""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Subquery

from approvals.models import Membership


def _may_belong(user) -> bool:
    return user is not None and user.is_authenticated and user.is_active


def membership_for(user, tenant_id: int, *, known: Membership | None = None) -> Membership | None:
    """The user's membership of the tenant, or None for anonymous, inactive or outside users.

    known: the membership the caller already read in this request (a page reads the user's
    memberships once); it is taken, without a query, only when it is this user's in this
    tenant. Anything else is read from the database.
    """
    if not _may_belong(user):
        return None
    if known is not None and known.user_id == user.pk and known.tenant_id == tenant_id:
        return known
    return (
        Membership.objects.filter(user=user, tenant_id=tenant_id).select_related("tenant").first()
    )


def memberships_in(users, tenant_id: int) -> dict[int, Membership]:
    """membership_for() for several users at once, in one query: {user id: membership}, without
    the users membership_for() would answer None for."""
    ids = {user.pk for user in users if _may_belong(user)}
    if not ids:
        return {}
    return {
        membership.user_id: membership
        for membership in Membership.objects.filter(user_id__in=ids, tenant_id=tenant_id)
    }


def role_in(tenant_id: int, user_field: str = "user_id") -> Subquery:
    """An annotation for a query of rows that name a user: that user's role in the tenant (None
    without a membership), read in the row's own query. membership_from_role() turns it into
    memberships_in()'s answer."""
    return Subquery(
        Membership.objects.filter(user_id=OuterRef(user_field), tenant_id=tenant_id).values("role")[
            :1
        ]
    )


def membership_from_role(user, tenant_id: int, role: str | None) -> Membership | None:
    """What membership_for(user, tenant) says, given role_in() of the row (no query)."""
    if role is None or not _may_belong(user):
        return None
    return Membership(user=user, tenant_id=tenant_id, role=role)


def has_membership(user_field: str = "user_id", tenant_field: str = "tenant_id") -> Exists:
    """An annotation for a query of rows that name a user and a tenant (an API token): whether
    that user has a membership of that tenant, read in the row's own query. is_member() turns
    it into membership_for()'s answer."""
    return Exists(
        Membership.objects.filter(user_id=OuterRef(user_field), tenant_id=OuterRef(tenant_field))
    )


def is_member(user, *, has_membership: bool) -> bool:
    """What membership_for(user, tenant) is not None says, given has_membership() of the row."""
    return has_membership and _may_belong(user)


def roles_of(user_ids: list[int]) -> dict[int, dict[int, str]]:
    """Each user's role in each tenant it belongs to, in one query: {user: {tenant: role}}."""
    roles: dict[int, dict[int, str]] = {user_id: {} for user_id in user_ids}
    for user_id, tenant_id, role in Membership.objects.filter(user_id__in=user_ids).values_list(
        "user_id", "tenant_id", "role"
    ):
        roles[user_id][tenant_id] = role
    return roles


def is_admin(user, tenant_id: int) -> bool:
    membership = membership_for(user, tenant_id)
    return membership is not None and membership.is_admin


def is_member_named(username: str, *, tenant_slugs: list[str]) -> bool:
    """Whether the user called username is a member of one of these tenants.

    A filter names only people its viewer can see: a user of another tenant and a name nobody
    has must look the same to the viewer, or the answer tells who exists elsewhere.
    """
    return Membership.objects.filter(
        user__username=username, tenant__slug__in=tenant_slugs
    ).exists()
