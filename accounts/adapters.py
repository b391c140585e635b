"""The console's adapters for allauth: who may sign in, how, and who may sign up (nobody, but
by invitation or a group mapped to a role)."""

from __future__ import annotations

import base64

from allauth.account.adapter import DefaultAccountAdapter
from allauth.mfa.adapter import DefaultMFAAdapter
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter

from accounts import audit
from approvals.core import crypto

# Two-factor secrets (the TOTP key, the recovery codes' seed) are sealed with the console's
# encryption keys; a value without the prefix was stored before sealing and is read as it is.
SEALED_PREFIX = "sealed:"
SEALED_PURPOSE = "mfa-secret"


class AccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request) -> bool:
        # Local accounts are made by an admin or by accepting an invitation, never by a form.
        return False

    def logout(self, request) -> None:
        # allauth signs a person out only through here (the sign-out button, a password change):
        # auth's user_logged_out would also count every session a test or a command closes.
        user = request.user if request.user.is_authenticated else None
        super().logout(request)
        audit.record_sign_out(user=user)


class SocialAccountAdapter(DefaultSocialAccountAdapter):
    def is_open_for_signup(self, request, sociallogin) -> bool:
        return False


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
