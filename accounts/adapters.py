"""The console's adapters for allauth: who may sign in, how, and who may sign up (nobody, but
by invitation or a group mapped to a role)."""

from __future__ import annotations

from allauth.account.adapter import DefaultAccountAdapter
from allauth.mfa.adapter import DefaultMFAAdapter
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter


class AccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request) -> bool:
        # Local accounts are made by an admin or by accepting an invitation, never by a form.
        return False


class SocialAccountAdapter(DefaultSocialAccountAdapter):
    def is_open_for_signup(self, request, sociallogin) -> bool:
        return False


class MFAAdapter(DefaultMFAAdapter):
    pass
