from __future__ import annotations

from django.http import HttpRequest


def console(request: HttpRequest) -> dict:
    """Navigation facts for the base template: the user's tenants and roles."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    from approvals.views import _active_tenant, _memberships

    memberships = _memberships(request)
    roles = {m.role for m in memberships.values()}
    return {
        "console_memberships": sorted(memberships.values(), key=lambda m: m.tenant.slug),
        "console_roles": roles,
        "console_active_tenant": _active_tenant(request),
        "console_can_read_history": bool(roles & {"auditor", "admin"}),
        "console_is_admin": "admin" in roles,
    }
