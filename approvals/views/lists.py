"""What the list pages share (runs, decided tickets, my decisions): their filter form read with
the tenant chosen in the switcher, the filter choices, and the next page's link."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.db.models import QuerySet

from approvals.core.pagination import Page
from approvals.forms.lists import day_end, day_start
from approvals.models import Membership
from approvals.views import access
from approvals.views.access import HtmxHttpRequest


def filter_form(request: HtmxHttpRequest, form_class: type[forms.Form]) -> forms.Form:
    """The page's filters, bound to the query string; no tenant named: the switcher's."""
    slugs = sorted(m.tenant.slug for m in access.memberships(request).values())
    data = request.GET.copy()
    if "tenant" not in data:
        data["tenant"] = access.active_tenant(request)
    return form_class(data, tenant_slugs=slugs)


def in_days(queryset: QuerySet, field: str, filters: dict) -> QuerySet:
    """Rows whose field falls on or after `since` and on or before `until` (UTC days)."""
    if filters.get("since"):
        queryset = queryset.filter(**{f"{field}__gte": day_start(filters["since"])})
    if filters.get("until"):
        queryset = queryset.filter(**{f"{field}__lt": day_end(filters["until"])})
    return queryset


def choices(request: HtmxHttpRequest) -> dict:
    """Filter choices come from configuration and memberships, never from scanning rows."""
    memberships = access.memberships(request)
    return {
        "tenants": sorted(m.tenant.slug for m in memberships.values()),
        "agents": sorted(settings.APPROVALS_AGENTS),
        "people": sorted(
            set(
                Membership.objects.filter(tenant_id__in=memberships.keys()).values_list(
                    "user__username", flat=True
                )
            )
        ),
    }


def next_query(request: HtmxHttpRequest, page: Page | None) -> str:
    if page and page.next_cursor:
        return access.with_query(request, after=page.next_cursor)
    return ""


def filtered(form: forms.Form) -> bool:
    """Whether any filter but the page is set (the empty state then says to clear them)."""
    return any(value for name, value in form.data.items() if name != "after")
