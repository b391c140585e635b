"""The console's adapters for allauth: who may sign in, how, and who may sign up (nobody, but
by invitation or a group mapped to a role). The rules are accounts.sso's."""

from __future__ import annotations

import base64

from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.internal.flows import reauthentication
from allauth.account.internal.flows.login import AUTHENTICATION_METHODS_SESSION_KEY
from allauth.core import context
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.mfa.adapter import DefaultMFAAdapter
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from django.contrib import messages
from django.shortcuts import redirect, render

from accounts import audit, sso
from approvals.core import crypto

# Two-factor secrets (the TOTP key, the recovery codes' seed) are sealed with the console's
# encryption keys; a value without the prefix was stored before sealing and is read as it is.
SEALED_PREFIX = "sealed:"
SEALED_PURPOSE = "mfa-secret"


def _method(request) -> str:
    methods = request.session.get(AUTHENTICATION_METHODS_SESSION_KEY) or []
    last = methods[-1] if methods else {}
    return "passkey" if last.get("method") == "mfa" else "password"


class AccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request) -> bool:
        # Local accounts are made by an admin or by accepting an invitation, never by a form.
        return False

    def pre_login(self, request, user, **kwargs):
        sociallogin = (kwargs.get("signal_kwargs") or {}).get("sociallogin")
        if sociallogin is not None:
            refusal = sso.refuse_sign_in(
                user=user, provider_id=sociallogin.account.provider, method="sso"
            )
        else:
            refusal = sso.refuse_sign_in(user=user, provider_id=None, method=_method(request))
        if refusal:
            messages.error(request, refusal)
            return redirect("login")
        return super().pre_login(request, user, **kwargs)

    def is_reauthentication_required(self, *, app: str, **kwargs) -> bool:
        """A person who signs in only through single sign-on has no password to type again and,
        before their first second factor, nothing else allauth could ask for: their provider's
        sign-in within the re-authentication window (ACCOUNT_REAUTHENTICATION_TIMEOUT) is the
        proof, and after it they sign in through the provider again (the page says so)."""
        if not super().is_reauthentication_required(app=app, **kwargs):
            return False
        request = context.request
        user = getattr(request, "user", None)
        if request is None or user is None or not user.is_authenticated:
            return True
        if reauthentication.get_reauthentication_flows(user):
            return True
        return not sso.signed_in_recently(request, user)

    def logout(self, request) -> None:
        # allauth signs a person out only through here (the sign-out button, a password change):
        # auth's user_logged_out would also count every session a test or a command closes.
        user = request.user if request.user.is_authenticated else None
        super().logout(request)
        audit.record_sign_out(user=user)


class SocialAccountAdapter(DefaultSocialAccountAdapter):
    def pre_social_login(self, request, sociallogin) -> None:
        if sociallogin.is_existing or sociallogin.state.get("process") == "connect":
            # Signed in already and linking their own provider account (the page "Your tenants
            # and roles"): no new account, so nothing to admit.
            return
        provider_id = sociallogin.account.provider
        try:
            sso.admit(request, provider_id=provider_id, extra_data=sociallogin.account.extra_data)
        except sso.SignUpRefused as refused:
            response = render(
                request,
                "account/sso_refused.html",
                {"reason": refused.sentence(), "provider_name": sso.provider_name(provider_id)},
                status=403,
            )
            raise ImmediateHttpResponse(response) from None
        # Never a second user with the email of an existing one (no takeover, no confusion).
        user = sociallogin.user
        if user is not None and not sso.email_is_free(user.email):
            user.email = ""
            sociallogin.email_addresses = []

    def is_open_for_signup(self, request, sociallogin) -> bool:
        try:
            sso.admit(
                request,
                provider_id=sociallogin.account.provider,
                extra_data=sociallogin.account.extra_data,
            )
        except sso.SignUpRefused:
            return False
        return True

    def populate_user(self, request, sociallogin, data):
        user = super().populate_user(request, sociallogin, data)
        user.username = sso.unique_username(sociallogin.account.extra_data)
        return user


class MFAAdapter(DefaultMFAAdapter):
    def encrypt(self, text: str) -> str:
        sealed = crypto.seal(text.encode(), purpose=SEALED_PURPOSE)
        parts = [base64.b64encode(p).decode() for p in (sealed.nonce, sealed.ciphertext)]
        return SEALED_PREFIX + ":".join([sealed.key_id, *parts])

    def decrypt(self, encrypted_text: str) -> str:
        if not encrypted_text.startswith(SEALED_PREFIX):
            return encrypted_text
        key_id, nonce, ciphertext = encrypted_text.removeprefix(SEALED_PREFIX).rsplit(":", 2)
        sealed = crypto.Sealed(key_id, base64.b64decode(nonce), base64.b64decode(ciphertext))
        return crypto.open_sealed(sealed, purpose=SEALED_PURPOSE).decode()
