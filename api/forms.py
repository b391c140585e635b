"""The console's token form: what an admin fills in to issue an API token."""

from __future__ import annotations

from django import forms

from api import tokens
from api.models import Scope
from approvals.models import Membership, Tenant


class TokenForm(forms.Form):
    tenant = forms.ChoiceField()
    name = forms.CharField(
        max_length=tokens.MAX_NAME_CHARS,
        help_text="What uses it, e.g. the release pipeline.",
        error_messages={"required": "Give the token a name."},
    )
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices,
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "Choose at least one scope."},
    )
    user = forms.ChoiceField(
        required=False,
        help_text="The person it acts as: decisions are theirs. Needed for tickets:decide.",
    )
    days = forms.IntegerField(
        min_value=1,
        max_value=tokens.MAX_DAYS,
        initial=tokens.DEFAULT_DAYS,
        help_text=f"Days until it expires: 1 to {tokens.MAX_DAYS}.",
    )

    def __init__(self, *args, tenants: dict[str, Tenant], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tenants = tenants
        self.fields["tenant"].choices = [(slug, t.name) for slug, t in sorted(tenants.items())]
        if len(tenants) == 1:
            self.fields["tenant"].initial = next(iter(tenants))
            self.fields["tenant"].widget = forms.HiddenInput()
        people = (
            Membership.objects.filter(tenant__in=tenants.values(), user__is_active=True)
            .select_related("user", "tenant")
            .order_by("user__username", "tenant__slug")
        )
        self.people = {m.user.get_username(): m.user for m in people}
        self.fields["user"].choices = [("", "Nobody (no decisions)")] + [
            (name, name) for name in sorted(self.people)
        ]

    def person(self):
        """The chosen person's user, or None; whether they may be chosen is api.tokens' rule."""
        username = self.cleaned_data.get("user")
        return self.people.get(username) if username else None
