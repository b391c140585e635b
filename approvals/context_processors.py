from __future__ import annotations

from django.http import HttpRequest

from approvals.views import access


def console(request: HttpRequest) -> dict:
    """Navigation facts for the base template: the user's tenants and roles."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    memberships = access.memberships(request)
    return {
        "console_memberships": sorted(memberships.values(), key=lambda m: m.tenant.slug),
        "console_roles": {m.role for m in memberships.values()},
        "console_active_tenant": access.active_tenant(request),
        "console_can_read_history": any(m.can_read_history for m in memberships.values()),
        "console_can_decide": any(m.can_decide for m in memberships.values()),
        "console_is_admin": any(m.is_admin for m in memberships.values()),
    }
