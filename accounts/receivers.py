"""allauth's signals, connected to the capability functions that act on them (AppConfig.ready).
Each receiver does nothing but call the function."""

from __future__ import annotations

from allauth.account.signals import user_logged_in
from django.contrib import messages
from django.dispatch import receiver

from accounts import sso


@receiver(user_logged_in, dispatch_uid="accounts.sso_signed_in")
def _sso_signed_in(sender, request, user, sociallogin=None, **kwargs) -> None:
    # Single sign-on only: password and passkey sign-ins are audited by their own receiver.
    if sociallogin is not None:
        done = sso.signed_in(
            request,
            user=user,
            provider_id=sociallogin.account.provider,
            extra_data=sociallogin.account.extra_data,
        )
        if done.accepted is not None:
            messages.success(
                request,
                f"Welcome to {done.accepted.tenant.name}: you are "
                f"{done.accepted.get_role_display().lower()}.",
            )
