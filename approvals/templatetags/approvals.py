from __future__ import annotations

from datetime import datetime

from django import template
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.urls import NoReverseMatch, get_script_prefix, get_urlconf, reverse
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince

from approvals.audit.sentences import ChangeLine, Description
from approvals.decisions import stepup
from approvals.policies import rules

register = template.Library()


def _span(seconds: int) -> str:
    minutes, _ = divmod(max(seconds, 0), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m" if minutes else "under a minute"


@register.simple_tag
def expiry(expires_at: datetime, now: datetime) -> str:
    """Time left before a ticket expires, as a <time> that console.js counts down."""
    seconds = int((expires_at - now).total_seconds())
    if seconds <= 0:
        return format_html(
            '<time class="expired" datetime="{}">expired</time>', expires_at.isoformat()
        )
    tone = "urgent" if seconds < 3600 else "soon" if seconds < 6 * 3600 else ""
    return format_html(
        '<time class="countdown {}" datetime="{}" data-countdown>in {}</time>',
        tone,
        expires_at.isoformat(),
        _span(seconds),
    )


# A list's rows link to each row's page: `{% url %}` resolves the pattern, the script prefix and
# the IRI quoting on every call (about 27 µs), hundreds of times a page. row_url reverses a view
# name once per script prefix and URL configuration, with an id no row has, and puts each row's
# id where that id stood. Like reverse() without current_app: the console's URLs are included
# under one namespace only (config/urls.py).
_ROW_MARK = str(2**53 + 1)
_ROW_PATHS_KEPT = 256
_row_paths: dict[tuple[str, str, str | None], tuple[str, str] | None] = {}


@receiver(setting_changed)
def _forget_row_paths(*, setting: str, **kwargs) -> None:
    if setting == "ROOT_URLCONF":
        _row_paths.clear()


@register.simple_tag
def row_url(view_name: str, pk) -> str:
    """The path of view_name for the id pk, as {% url view_name pk %} gives it."""
    if type(pk) is not int or pk < 0:
        return reverse(view_name, args=[pk])
    key = (view_name, get_script_prefix(), get_urlconf())
    around = _row_paths.get(key, False)
    if around is False:
        try:
            parts = reverse(view_name, args=[int(_ROW_MARK)]).split(_ROW_MARK)
        except NoReverseMatch:
            parts = []
        around = (parts[0], parts[1]) if len(parts) == 2 else None
        if len(_row_paths) >= _ROW_PATHS_KEPT:
            # Script prefixes come from the server's SCRIPT_NAME: a handful, never a flood.
            _row_paths.clear()
        _row_paths[key] = around
    if around is None:
        return reverse(view_name, args=[pk])
    return f"{around[0]}{pk}{around[1]}"


@register.simple_tag
def now_expiry(expires_at: datetime) -> str:
    return expiry(expires_at, timezone.now())


@register.filter
def ago(value: datetime) -> str:
    """ "just now", "5 minutes ago", "2 days, 3 hours ago"."""
    if value is None:
        return ""
    if (timezone.now() - value).total_seconds() < 60:
        return "just now"
    return f"{timesince(value)} ago"


@register.filter
def step_up_summary(policy) -> str:
    """The policy's step-up in a sentence ("" when it asks for no second factor)."""
    return stepup.describe(policy)


@register.filter
def condition(rule: dict) -> str:
    """A step-up condition as the policy form writes it: "environment == production"."""
    return rules.describe_condition(rule)


def _change(change: ChangeLine) -> str:
    if change.kind == "added":
        how = format_html("added <ins>{}</ins>", change.after)
    elif change.kind == "removed":
        how = format_html("removed <del>{}</del>", change.before)
    else:
        how = format_html("<del>{}</del> → <ins>{}</ins>", change.before, change.after)
    return format_html(
        '<li class="change {}"><span class="what">{}</span> {}</li>', change.kind, change.what, how
    )


@register.filter
def said(description: Description) -> SafeString:
    """An audit event's sentence as markup, with what changed: every part escaped (a value
    written by a person, a model or a caller is never markup), the values in <strong>.

    A filter rather than an included template: the audit page shows fifty of them, and a
    template's loop over a sentence's parts cost a quarter of the page's rows.
    """
    sentence = "".join(
        f"<strong>{escape(part.text)}</strong>" if part.is_value else escape(part.text)
        for part in description.parts
    )
    html = f'<span class="sentence">{sentence}.</span>'
    if description.changes:
        html += '<ul class="changes">' + "".join(map(_change, description.changes)) + "</ul>"
    return mark_safe(html)  # noqa: S308 - every value above is escaped
