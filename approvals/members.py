"""Who a user is in a tenant: their membership, the one place capabilities look it up."""

from __future__ import annotations

from approvals.models import Membership


def membership_for(user, tenant_id: int) -> Membership | None:
    """The user's membership of the tenant, or None for anonymous, inactive or outside users."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    return Membership.objects.filter(user=user, tenant_id=tenant_id).first()


def is_admin(user, tenant_id: int) -> bool:
    membership = membership_for(user, tenant_id)
    return membership is not None and membership.is_admin
