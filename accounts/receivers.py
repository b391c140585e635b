"""allauth's signals, connected to the capability functions that act on them (AppConfig.ready).
Each receiver does nothing but call the function."""

from __future__ import annotations

from allauth.account.signals import user_logged_in
from allauth.mfa import signals as mfa_signals
from django.contrib import messages
from django.dispatch import receiver

from accounts import audit, sso


@receiver(user_logged_in, dispatch_uid="accounts.signed_in")
def _signed_in(sender, request, user, sociallogin=None, **kwargs) -> None:
    extra = None
    if sociallogin is not None:
        # Single sign-on first: the invitation followed and the mapped groups make the
        # memberships the sign-in is then audited in.
        provider_id = sociallogin.account.provider
        done = sso.signed_in(
            request, user=user, provider_id=provider_id, extra_data=sociallogin.account.extra_data
        )
        if done.accepted is not None:
            messages.success(
                request,
                f"Welcome to {done.accepted.tenant.name}: you are "
                f"{done.accepted.get_role_display().lower()}.",
            )
        extra = {"provider_name": sso.provider_name(provider_id)}
    audit.record_sign_in(request=request, user=user, extra=extra)


@receiver(mfa_signals.authenticator_added, dispatch_uid="accounts.mfa_enrolled")
def _mfa_enrolled(sender, request, user, authenticator, **kwargs) -> None:
    audit.record_enrolled(user=user, authenticator=authenticator)


@receiver(mfa_signals.authenticator_removed, dispatch_uid="accounts.mfa_removed")
def _mfa_removed(sender, request, user, authenticator, **kwargs) -> None:
    audit.record_removed(user=user, authenticator=authenticator)


@receiver(mfa_signals.authenticator_reset, dispatch_uid="accounts.mfa_reset")
def _mfa_reset(sender, request, user, authenticator, **kwargs) -> None:
    audit.record_reset(user=user, authenticator=authenticator)


@receiver(mfa_signals.authenticator_used, dispatch_uid="accounts.mfa_used")
def _mfa_used(sender, request, user, authenticator, **kwargs) -> None:
    audit.record_used(user=user, authenticator=authenticator)


@receiver(mfa_signals.authentication_failed, dispatch_uid="accounts.mfa_failed")
def _mfa_failed(sender, request, user, authenticator, reauthentication=False, **kwargs) -> None:
    audit.record_failed(
        user=user, authenticator=authenticator, reauthentication=bool(reauthentication)
    )
