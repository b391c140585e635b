"""Filters of the runs list, the decided tickets and "my decisions", and the search box."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from django import forms

from approvals import members, search
from approvals.forms.filters import QueueFilterForm
from approvals.models import RunStatus, TicketStatus

DECIDED_STATUSES = (
    TicketStatus.APPROVED,
    TicketStatus.REJECTED,
    TicketStatus.EXPIRED,
    TicketStatus.SUPERSEDED,
)


def day_start(day: date) -> datetime:
    """Midnight UTC of a day: date filters compare times, so they keep to the indexes."""
    return datetime.combine(day, time.min, tzinfo=UTC)


def day_end(day: date) -> datetime:
    """Midnight UTC after a day (exclusive)."""
    return day_start(day) + timedelta(days=1)


class SearchForm(forms.Form):
    q = forms.CharField(required=False, max_length=search.MAX_TEXT, strip=True)


class _DatedListForm(QueueFilterForm):
    """The queue's filters (tenant, agent, tool, requester, page) with a date range and search."""

    q = forms.CharField(required=False, max_length=search.MAX_TEXT, strip=True)
    since = forms.DateField(required=False)
    until = forms.DateField(required=False)
    status = forms.CharField(required=False, max_length=20)
    status_choices: tuple[str, ...] = ()

    def clean_status(self) -> str:
        value = self.cleaned_data["status"]
        if value and value not in self.status_choices:
            raise forms.ValidationError(f"There is no status called {value!r} here.")
        return value

    def clean(self):
        data = super().clean()
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            raise forms.ValidationError("The start date is after the end date.")
        return data


class RunFilterForm(_DatedListForm):
    status_choices = tuple(RunStatus.values)


class DecidedFilterForm(_DatedListForm):
    status_choices = tuple(DECIDED_STATUSES)
    decider = forms.CharField(required=False, max_length=150)

    def clean_decider(self) -> str:
        name = self.cleaned_data["decider"]
        if not name:
            return name
        # Like the requester: someone of another tenant is refused like a name nobody has.
        if not members.is_member_named(name, tenant_slugs=self.tenant_slugs):
            raise forms.ValidationError(f"Nobody called {name!r} is a member of your tenants.")
        return name


class MyDecisionsFilterForm(_DatedListForm):
    # A ticket voted on may still wait for more approvals.
    status_choices = (TicketStatus.PENDING, *DECIDED_STATUSES)
