"""Forms of the Team pages: add a member, change a role, invite by email, accept an invitation."""

from __future__ import annotations

from django import forms

from approvals.models import Role


class AddMemberForm(forms.Form):
    tenant = forms.CharField(max_length=64, widget=forms.HiddenInput)
    user = forms.CharField(
        max_length=254,
        label="Username or email",
        help_text="Someone who already has an account; invite anyone else by email.",
    )
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)


class RoleForm(forms.Form):
    tenant = forms.CharField(max_length=64, widget=forms.HiddenInput)
    role = forms.ChoiceField(choices=Role.choices)


class InviteForm(forms.Form):
    tenant = forms.CharField(max_length=64, widget=forms.HiddenInput)
    email = forms.EmailField(max_length=254, label="Email")
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)


class AcceptForm(forms.Form):
    """A new account for the invitee; a signed-in invitee posts it empty."""

    username = forms.CharField(max_length=150, label="Username")
    password = forms.CharField(label="Password", strip=False, widget=forms.PasswordInput)
    password_again = forms.CharField(
        label="Password again", strip=False, widget=forms.PasswordInput
    )

    def clean(self) -> dict:
        data = super().clean()
        if data.get("password") and data.get("password") != data.get("password_again"):
            self.add_error("password_again", "The two passwords differ.")
        return data
