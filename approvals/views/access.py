"""Who may see what: the one lookup per object kind that answers 404 outside the user's tenants."""

from __future__ import annotations

from django.http import Http404, HttpRequest
from django_htmx.middleware import HtmxDetails

from approvals.core import statements
from approvals.models import Membership, Run, Tenant, Ticket


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def memberships(request: HttpRequest) -> dict[int, Membership]:
    cached = getattr(request, "_console_memberships", None)
    if cached is None:
        mine = statements.objects("access.memberships", _memberships, {"user": request.user.pk})
        cached = request._console_memberships = {m.tenant_id: m for m in mine}
    return cached


def _memberships(values):
    return Membership.objects.filter(user_id=values["user"]).select_related("tenant")


# What a ticket's page shows beside the ticket, read with it.
TICKET_PAGE = ("run", "tenant", "requested_by", "decided_by")


def get_ticket_for_user(
    request: HttpRequest, pk: int, *, related: tuple[str, ...] = TICKET_PAGE
) -> tuple[Ticket, Membership]:
    """The ticket, with its `related` rows, if it is in one of the user's tenants; else 404.
    related: what the caller reads of it (a decision: its run, whose state the digest gate
    opens); anything else is read when first asked for."""
    mine = memberships(request)
    if not mine:
        raise Http404("No such ticket.")
    tenants = {f"tenant{n}": tenant_id for n, tenant_id in enumerate(mine)}

    def read(values):
        return Ticket.objects.select_related(*related).filter(
            pk=values["ticket"], tenant_id__in=[values[name] for name in tenants]
        )

    try:
        # The page's read: written once per process for each `related` and number of tenants.
        ticket = statements.get(
            ("access.ticket", related, len(tenants)), read, {"ticket": pk, **tenants}
        )
    except Ticket.DoesNotExist:
        raise Http404("No such ticket.") from None
    return ticket, mine[ticket.tenant_id]


def get_run_for_user(request: HttpRequest, pk: int) -> tuple[Run, Membership]:
    mine = memberships(request)
    try:
        run = Run.objects.select_related("tenant", "requested_by").get(
            pk=pk, tenant_id__in=mine.keys()
        )
    except Run.DoesNotExist:
        raise Http404("No such run.") from None
    return run, mine[run.tenant_id]


def active_tenant(request: HttpRequest) -> str:
    slug = request.session.get("console_tenant", "")
    slugs = {m.tenant.slug for m in memberships(request).values()}
    return slug if slug in slugs else ""


def with_query(request: HttpRequest, **changes: str) -> str:
    query = request.GET.copy()
    for key, value in changes.items():
        query[key] = value
    return query.urlencode()


def admin_tenants(request: HttpRequest) -> dict[str, Tenant]:
    """The tenants the user administers, by slug."""
    return {m.tenant.slug: m.tenant for m in memberships(request).values() if m.is_admin}


def history_tenants(request: HttpRequest) -> dict[int, Tenant]:
    """The tenants whose audit history the user reads, by id."""
    return {
        tenant_id: m.tenant for tenant_id, m in memberships(request).items() if m.can_read_history
    }


def get_admin_tenant(request: HttpRequest, slug: str) -> Tenant:
    """The tenant named (or the active one, or the first) if the user is its admin; else 404,
    the same for another tenant's slug and for a tenant where the user is not an admin."""
    admin_of = admin_tenants(request)
    slug = slug or active_tenant(request)
    if not slug and admin_of:
        slug = sorted(admin_of)[0]
    tenant = admin_of.get(slug)
    if tenant is None:
        raise Http404("No such page.")
    return tenant
