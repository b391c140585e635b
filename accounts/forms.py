"""The forms of the accounts pages."""

from __future__ import annotations

from django import forms


class EndSessionsForm(forms.Form):
    """Sign out one of one's other sessions (by its id in the list), or all of them (none)."""

    session = forms.IntegerField(required=False, min_value=1)
